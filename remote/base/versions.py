"""PEP 440 versions and version ranges, standard library only.

Ranges in patchsets must match nightlies (`0.16.0rc2.dev344+gea5f903f8`), so
unlike pip's default, pre-releases and dev releases are never excluded: a range
is a plain comparison under PEP 440 ordering. The local label is ignored.
"""
import re

#: The PEP 440 regex and one specifier's ('>=0.16.0'), as text: `re` compiles each at its first use and
#: keeps it (its own cache), so a call whose versions are release numbers alone ("0.3.0"), as most are,
#: never pays the compile (with IGNORECASE, a millisecond of every call's start on a host).
_VERSION = (
    r"""^\s*v?(?:(?P<epoch>[0-9]+)!)?
    (?P<release>[0-9]+(?:\.[0-9]+)*)
    (?:[-_.]?(?P<pre_l>a|b|c|rc|alpha|beta|pre|preview)[-_.]?(?P<pre_n>[0-9]+)?)?
    (?:-(?P<post_n1>[0-9]+)|[-_.]?(?P<post_l>post|rev|r)[-_.]?(?P<post_n2>[0-9]+)?)?
    (?:[-_.]?(?P<dev_l>dev)[-_.]?(?P<dev_n>[0-9]+)?)?
    (?:\+(?P<local>[a-z0-9]+(?:[-_.][a-z0-9]+)*))?\s*$""")
_VERSION_FLAGS = re.VERBOSE | re.IGNORECASE
_PRE_ORDER = {"a": 0, "alpha": 0, "b": 1, "beta": 1, "c": 2, "rc": 2, "pre": 2, "preview": 2}
_SPECIFIER = r"^\s*(===|==|!=|<=|>=|<|>|~=)\s*([^\s,]+)\s*$"
_INFINITY = float("inf")


class InvalidVersion(ValueError):
    pass


class Version:
    """A parsed PEP 440 version; ordering follows PEP 440."""

    def __init__(self, text):
        self.text = text
        numbers = text.split(".")
        if all(number.isascii() and number.isdigit() for number in numbers):  # release numbers alone
            self.release, self.local, epoch, pre, post, dev = tuple(map(int, numbers)), None, 0, None, None, None
        else:
            match = re.match(_VERSION, text, _VERSION_FLAGS)
            if not match:
                raise InvalidVersion("%r is not a PEP 440 version" % (text,))
            self.release = tuple(int(part) for part in match.group("release").split("."))
            self.local = match.group("local")
            epoch = int(match.group("epoch") or 0)
            pre = None
            if match.group("pre_l"):
                pre = (_PRE_ORDER[match.group("pre_l").lower()], int(match.group("pre_n") or 0))
            post_n = match.group("post_n1") or match.group("post_n2")
            post = int(post_n or 0) if (match.group("post_n1") or match.group("post_l")) else None
            dev = int(match.group("dev_n") or 0) if match.group("dev_l") else None
        self.is_prerelease = pre is not None or dev is not None
        # Sort key: X.devN < XaN < XbN < XrcN < X < X.postN (PEP 440 "summary of permitted suffixes").
        if pre is None and post is None and dev is not None:
            pre_key = (-_INFINITY, 0)
        elif pre is None:
            pre_key = (_INFINITY, 0)
        else:
            pre_key = pre
        self._key = (epoch, _trim(self.release), pre_key,
                     post if post is not None else -_INFINITY,
                     dev if dev is not None else _INFINITY)

    def __lt__(self, other):
        return self._key < other._key

    def __le__(self, other):
        return self._key <= other._key

    def __gt__(self, other):
        return self._key > other._key

    def __ge__(self, other):
        return self._key >= other._key

    def __eq__(self, other):
        return isinstance(other, Version) and self._key == other._key

    def __hash__(self):
        return hash(self._key)

    def __repr__(self):
        return "Version(%r)" % (self.text,)


def _trim(release):
    release = list(release)
    while len(release) > 1 and release[-1] == 0:
        release.pop()
    return tuple(release)


class InvalidRange(ValueError):
    pass


def _specifier_matches(operator, operand, version):
    if operator == "==" and operand.endswith(".*"):
        prefix = Version(operand[:-2]).release
        return version.release[:len(prefix)] + (0,) * max(0, len(prefix) - len(version.release)) == prefix
    if operator == "!=" and operand.endswith(".*"):
        return not _specifier_matches("==", operand, version)
    bound = Version(operand)
    if operator == "~=":
        if len(bound.release) < 2:
            raise InvalidRange("~=%s needs at least two release numbers" % operand)
        prefix = ".".join(str(n) for n in bound.release[:-1])
        return version >= bound and _specifier_matches("==", prefix + ".*", version)
    return {"==": version == bound, "===": version.text == operand, "!=": version != bound,
            "<": version < bound, "<=": version <= bound, ">": version > bound, ">=": version >= bound}[operator]


def check_range(spec):
    """Raise InvalidRange naming the bad part unless `spec` is a range (a string, or a list of strings)."""
    alternatives = spec if isinstance(spec, list) else [spec]
    if not alternatives or not all(isinstance(a, str) and a.strip() for a in alternatives):
        raise InvalidRange("expected a specifier string such as '==0.16.*' or a list of them, got %r" % (spec,))
    for alternative in alternatives:
        for part in alternative.split(","):
            match = re.match(_SPECIFIER, part)
            if not match:
                raise InvalidRange("%r is not a version specifier (use e.g. '>=0.16.0.dev0' or '==0.16.*')" % part)
            operand = match.group(2)
            try:
                Version(operand[:-2] if operand.endswith(".*") else operand)
            except InvalidVersion:
                raise InvalidRange("%r: %r is not a PEP 440 version" % (part.strip(), operand)) from None


def in_range(version_text, spec):
    """True when the version satisfies the range: any alternative of a list, every comma-part of a string."""
    check_range(spec)
    version = Version(version_text)
    for alternative in spec if isinstance(spec, list) else [spec]:
        parts = [re.match(_SPECIFIER, part).groups() for part in alternative.split(",")]
        if all(_specifier_matches(operator, operand, version) for operator, operand in parts):
            return True
    return False


def describe_range(spec):
    return " or ".join(spec) if isinstance(spec, list) else spec
