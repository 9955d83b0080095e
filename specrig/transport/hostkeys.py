"""Host-key verification as OpenSSH does it, refusing what OpenSSH would ask about.

Known keys come from the user's known_hosts files (ssh_config's UserKnownHostsFile, by default
~/.ssh/known_hosts and ~/.ssh/known_hosts2), the global ones (GlobalKnownHostsFile, by default
/etc/ssh/ssh_known_hosts{,2}) and the project's `.specrig/known_hosts`, in that order; plain,
hashed (`|1|salt|hash`), `[host]:port` and wildcard entries all match. An unknown key follows
hosts.yaml's `host_key_policy`, else ssh_config's StrictHostKeyChecking, else is refused. A
changed key is always refused. New keys are recorded only in the project file: the user's files
are read, never written.

Fabric installs paramiko's AutoAddPolicy, which trusts any key; specrig replaces it.
"""
from __future__ import annotations

import base64
import getpass
import hashlib
import os
import re
import shlex
import socket
from pathlib import Path

import paramiko
from paramiko.hostkeys import HostKeyEntry

from specrig.errors import HostKeyChanged, HostKeyUnknown, UsageError

USER_KNOWN_HOSTS = "~/.ssh/known_hosts ~/.ssh/known_hosts2"
GLOBAL_KNOWN_HOSTS = "/etc/ssh/ssh_known_hosts /etc/ssh/ssh_known_hosts2"
#: ssh_config's StrictHostKeyChecking as a specrig policy. `no`/`off` record the key rather than
#: trusting it silently every time; `ask` refuses, since specrig never prompts.
STRICT_HOST_KEY_CHECKING = {"yes": "reject", "true": "reject", "ask": "reject", "accept-new": "accept-new",
                            "no": "accept-new", "false": "accept-new", "off": "accept-new"}


def fingerprint(key: paramiko.PKey) -> str:
    """OpenSSH's SHA256 fingerprint, as `ssh-keygen -lf` prints it."""
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def known_hosts_name(hostname: str, port: int) -> str:
    """The known_hosts spelling: `host` for port 22, `[host]:port` otherwise."""
    return hostname if port == 22 else f"[{hostname}]:{port}"


def record(known_hosts: str, hostname: str, key: paramiko.PKey) -> None:
    """Append one entry (hostname already in known_hosts spelling) to a known_hosts file."""
    path = Path(known_hosts)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(f"{hostname} {key.get_name()} {key.get_base64()}\n")
    os.chmod(path, 0o600)


class HostKeyCheck(paramiko.MissingHostKeyPolicy):
    """One SSH hop's verification: the keys its files hold for it, and what meets an unknown key.

    It is also the paramiko policy of that hop's client, called only when no file knows the host.
    """

    def __init__(self, *, client: paramiko.SSHClient, name: str, policy: str, reason: str, project: str | None,
                 files: list[str], user_files: int, known: list[tuple[str, paramiko.PKey]],
                 revoked: list[tuple[str, paramiko.PKey]], trust_name: str):
        #: The hop's client: its transport holds the key the host sent, even after a failed login.
        self.client = client
        #: The host as the files spell it: `[host]:port`, or ssh_config's HostKeyAlias.
        self.name = name
        self.policy = policy
        #: Where the policy came from, for messages.
        self.reason = reason
        #: The project known_hosts, the one file new keys go to.
        self.project = project
        #: Every file consulted, in order (missing ones included): the user's, the global ones, the project's.
        self.files = files
        #: How many of `files` come first from UserKnownHostsFile.
        self.user_files = user_files
        #: (file, key) for each key the files hold for this host, first file first.
        self.known = known
        self.revoked = revoked
        self.trust_name = trust_name
        self.recorded: list[tuple[str, str]] = []

    def missing_host_key(self, client, hostname, key):
        for path, bad in self.revoked:
            if bad == key:
                raise HostKeyChanged(f"host key of {self.name} is REVOKED in {path}: {key.get_name()} "
                                     f"{fingerprint(key)}; refusing to connect",
                                     hint="the host's admin must install a new host key")
        if self.policy == "accept-new" and self.project:
            record(self.project, self.name, key)
            client.get_host_keys().add(hostname, key.get_name(), key)
            self.recorded.append((self.name, fingerprint(key)))
            return
        # The files that exist, and the user's first even if absent: OpenSSH would have written there.
        read = [f for i, f in enumerate(self.files) if os.path.isfile(f) or (i == 0 and self.user_files)]
        files = ", ".join(dict.fromkeys(_home_relative(f) for f in read)) or "no known_hosts file"
        raise HostKeyUnknown(
            f"host key of {self.name} is not known: {key.get_name()} {fingerprint(key)} (looked in {files})",
            fingerprint=fingerprint(key),
            hint=f"{self.reason}; check the fingerprint with the host's admin, "
                 f"then run `inv trust-host --host {self.trust_name}`",
        )

    def server_key(self) -> paramiko.PKey | None:
        """The key the host sent, once the key exchange is done."""
        transport = self.client.get_transport()
        try:
            return transport.get_remote_server_key() if transport else None
        except paramiko.SSHException:  # no key exchange yet
            return None

    def holder(self, key: paramiko.PKey) -> str | None:
        """The file holding `key` for this host."""
        return next((path for path, known in self.known if known == key), None)

    def changed(self, target: str, exc: paramiko.BadHostKeyException) -> HostKeyChanged:
        """The refusal of a key that differs from the one a file holds, naming that file."""
        holder = self.holder(exc.expected_key) or self.project or "the project known_hosts"
        return HostKeyChanged(
            f"host key of {target} CHANGED: {holder} holds {exc.expected_key.get_name()} "
            f"{fingerprint(exc.expected_key)}, the host sent {exc.key.get_name()} {fingerprint(exc.key)}; "
            "refusing to connect",
            hint="someone may be intercepting the connection; if the host was reinstalled, remove the old key "
                 f"(ssh-keygen -R '{self.name}' -f {holder}) and run `inv trust-host --host {self.trust_name}`",
        )


def install(connection, *, known_hosts: str | None, policy: str | None, trust_name: str) -> HostKeyCheck:
    """Set up one Fabric connection's client (a hop) to verify its host's key; returns the check.

    `policy` is hosts.yaml's; None defers to the hop's ssh_config. Only this host's keys are put
    into the client's own key set: the set is never saved (nothing calls save_host_keys and no
    file is bound with load_host_keys), so no file of the user's can be rewritten.
    """
    config = connection.ssh_config
    name = config.get("hostkeyalias") or known_hosts_name(connection.host, connection.port)
    tokens = _tokens(connection, name)
    user_files = _files(config, "UserKnownHostsFile", USER_KNOWN_HOSTS, tokens)
    files = [*user_files, *_files(config, "GlobalKnownHostsFile", GLOBAL_KNOWN_HOSTS, tokens)]
    if known_hosts:
        files.append(known_hosts)
    known, revoked = [], []
    for path in files:
        for marker, key in _keys_for(path, name):
            (revoked if marker == "@revoked" else known).append((path, key))
    known = [(path, key) for path, key in known if all(key != bad for _, bad in revoked)]
    # paramiko compares the host's key with the first one of its type and prefers the first type
    # when negotiating: the first file holding a type is the one that decides.
    keys = connection.client.get_host_keys()
    # paramiko looks the key up under the name it connected to, whatever name the files use.
    paramiko_name = known_hosts_name(connection.host, connection.port)
    for _, key in known:
        entry = keys.lookup(paramiko_name)
        if entry is None or key.get_name() not in entry:
            keys.add(paramiko_name, key.get_name(), key)
    effective, reason = _policy(config, policy)
    check = HostKeyCheck(client=connection.client, name=name, policy=effective, reason=reason, project=known_hosts,
                         files=files, user_files=len(user_files), known=known, revoked=revoked, trust_name=trust_name)
    connection.client.set_missing_host_key_policy(check)
    return check


def _policy(config, policy: str | None) -> tuple[str, str]:
    """hosts.yaml's policy wins; else ssh_config's StrictHostKeyChecking; else reject."""
    if policy is not None:
        return policy, f"hosts.yaml sets host_key_policy {policy}"
    value = config.get("stricthostkeychecking")
    if value is None:
        return "reject", "unknown host keys are refused by default"
    effective = STRICT_HOST_KEY_CHECKING.get(value.lower())
    if effective is None:
        raise UsageError(f"ssh_config: StrictHostKeyChecking {value!r} is not a known value",
                         hint=f"use one of {', '.join(STRICT_HOST_KEY_CHECKING)}")
    return effective, f"ssh_config sets StrictHostKeyChecking {value}"


def _files(config, option: str, default: str, tokens: dict[str, str]) -> list[str]:
    """The files an ssh_config option names (space-separated, `~`, %-tokens and ${VAR} expanded)."""
    value = config.get(option.lower()) or default  # paramiko lowercases the option names
    try:
        words = shlex.split(value)
    except ValueError:
        raise UsageError(f"ssh_config: {option} {value!r}: unbalanced quotes", hint="quote each path whole") from None
    if [w.lower() for w in words] == ["none"]:
        return []
    return [_expand(word, tokens, option=option) for word in words]


def _expand(path: str, tokens: dict[str, str], *, option: str) -> str:
    def substitute(match: re.Match) -> str:
        if match.group(1) is not None:
            token = "%" + match.group(1)
            if token not in tokens:
                raise UsageError(f"ssh_config: {option} {path!r}: token {token} is not supported here",
                                 hint=f"use {', '.join(tokens)}, ~ or ${{VAR}}")
            return tokens[token]
        if match.group(2) not in os.environ:
            raise UsageError(f"ssh_config: {option} {path!r}: environment variable {match.group(2)} is not set")
        return os.environ[match.group(2)]

    # expanduser reads $HOME now, so a HOME set for this run is honoured.
    return re.sub(r"%(.)|\$\{([A-Za-z_][A-Za-z0-9_]*)\}", substitute, os.path.expanduser(path))


def _tokens(connection, name: str) -> dict[str, str]:
    """OpenSSH's TOKENS that make sense for a known_hosts path (%C, a hash, is left out)."""
    hostname = socket.gethostname()
    return {"%%": "%", "%d": os.path.expanduser("~"), "%h": connection.host, "%k": name,
            "%n": connection.original_host or connection.host, "%p": str(connection.port),
            "%r": connection.user or getpass.getuser(), "%u": getpass.getuser(), "%i": str(os.getuid()),
            "%L": hostname.split(".")[0], "%l": hostname}


def _keys_for(path: str, name: str) -> list[tuple[str | None, paramiko.PKey]]:
    """(marker, key) for each line of a known_hosts file whose host patterns match `name`.

    Lines OpenSSH would skip are skipped too (paramiko's HostKeys.load stops at a bad base64 line);
    a missing or unreadable file holds nothing, as for OpenSSH.
    """
    try:
        lines = Path(path).read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return []
    found = []
    for lineno, line in enumerate(lines, 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        marker = None
        if line.startswith("@"):
            marker, _, line = line.partition(" ")
            if marker != "@revoked":
                continue  # @cert-authority: paramiko cannot verify host certificates
            line = line.strip()
        try:
            entry = HostKeyEntry.from_line(line, lineno)
        except Exception:  # bad base64 or key data: OpenSSH ignores the line
            continue
        if entry is not None and entry.key is not None and _matches(name, entry.hostnames):
            found.append((marker, entry.key))
    return found


def _matches(name: str, patterns: list[str]) -> bool:
    """OpenSSH's known_hosts host matching: exact, hashed, `*`/`?` wildcards, `!` negation."""
    name = name.lower()
    matched = False
    for pattern in patterns:
        negated = pattern.startswith("!")
        pattern = pattern[1:] if negated else pattern
        if pattern.startswith("|1|"):
            hit = paramiko.HostKeys.hash_host(name, pattern) == pattern
        elif "*" in pattern or "?" in pattern:
            regex = re.escape(pattern.lower()).replace(r"\*", ".*").replace(r"\?", ".")
            hit = re.fullmatch(regex, name) is not None
        else:
            hit = pattern.lower() == name
        if hit and negated:
            return False
        matched = matched or hit
    return matched


def _home_relative(path: str) -> str:
    home = os.path.expanduser("~")
    return "~" + path[len(home):] if home not in ("", "/") and path.startswith(home + "/") else path
