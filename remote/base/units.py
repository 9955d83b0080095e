"""How specrig writes a number of bytes, on both sides (the laptop loads this file: specrig/contract.py):
IEC units, the ones nvidia-smi, df -h and free use. One formatter, so a size in a preflight message, a
driver's error and the laptop's tables reads the same."""

UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")


def human_bytes(count):
    """'512 B', '1.5 KiB', '80.0 GiB'; '-' for None (a size nobody could read)."""
    if count is None:
        return "-"
    power = 0
    while abs(count) >= 1024 and power < len(UNITS) - 1:
        count /= 1024.0
        power += 1
    return "%d B" % count if power == 0 else "%.1f %s" % (count, UNITS[power])
