"""Why a driver attempt failed, from its log and exit status, by the rules in classify_rules.json.

The rules are data: pattern -> kind, retryable, explanation, advice. The last
traceback in the log is searched first (its final exception line names the
failure); the whole tail only when nothing matches there, so that a warning
printed long before the failure does not decide the kind.
"""
import json
import os
import re
import signal

RULES_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "classify_rules.json")
TRACEBACK = "Traceback (most recent call last):"
FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<function>\S+)', re.MULTILINE)


class _Defaults(dict):
    """str.format_map mapping that leaves unknown fields visible instead of failing."""

    def __missing__(self, key):
        return "{" + key + "}"


class Rule:
    def __init__(self, *, kind, retryable, explain, advice, log=None, signal=None):
        if not isinstance(retryable, bool):
            raise ValueError("rule %r: retryable must be true or false, got %r" % (kind, retryable))
        if (log is None) == (signal is None):
            raise ValueError("rule %r: give exactly one of `log` and `signal`" % (kind,))
        self.kind = kind
        self.retryable = retryable
        self.explain = explain
        self.advice = advice
        self.pattern = re.compile(log, re.MULTILINE) if log is not None else None
        self.signals = frozenset(signal or ())

    def match(self, text, signal_name):
        """The named groups of a match (a dict, maybe empty), or None."""
        if self.pattern is not None:
            found = self.pattern.search(text)
            return {k: v for k, v in found.groupdict().items() if v is not None} if found else None
        return {} if signal_name in self.signals else None


def load_rules(path=RULES_FILE):
    """(rules, fallback, caller_from) from the table."""
    with open(path, encoding="utf-8") as handle:
        table = json.load(handle)
    return [Rule(**rule) for rule in table["rules"]], table["fallback"], table.get("caller_from", [])


def signal_name(exit_status):
    """'SIGKILL' for -9 (Popen's way of saying killed by a signal), None for a normal exit."""
    if exit_status is None or exit_status >= 0:
        return None
    try:
        return signal.Signals(-exit_status).name
    except ValueError:
        return "signal %d" % -exit_status


def last_traceback(text):
    start = text.rfind(TRACEBACK)
    return text[start:] if start >= 0 else ""


def classify(log_text, exit_status, *, host="the host", rules=None):
    """{"kind", "retryable", "explain", "advice", "exit_status", "signal", "callee", "caller", "evidence"}."""
    rules, fallback, caller_from = rules or load_rules()
    sig = signal_name(exit_status)
    tail = last_traceback(log_text)
    matched, groups, matched_in = None, {}, tail or log_text
    # A signal decides first: a killed process printed no traceback of its own death.
    places = ([("", sig)] if sig else []) + [(tail, None), (log_text, None)]
    for text, sig_for_rule in places:
        for rule in rules:
            if (rule.pattern is None) != (sig_for_rule is not None):
                continue
            found = rule.match(text, sig_for_rule)
            if found is not None:
                matched, groups, matched_in = rule, found, text
                break
        if matched:
            break
    fields = _Defaults(groups, host=host, signal=sig or "", exit_status=exit_status)
    source = matched.__dict__ if matched else fallback
    result = {
        "kind": source["kind"],
        "retryable": source["retryable"],
        "explain": source["explain"].format_map(fields),
        "advice": source["advice"].format_map(fields),
        "exit_status": exit_status,
        "signal": sig,
        "callee": groups.get("callee"),
        "evidence": _evidence(matched, matched_in),
        "caller": None,
    }
    result["caller"] = _caller(list(FRAME.finditer(tail)), caller_from)
    return result


def _caller(frames, caller_from):
    """The last frame in the first of `caller_from`'s paths that has one, else the last frame."""
    for marker in caller_from:
        inside = [frame for frame in frames if marker in frame.group("file")]
        if inside:
            frames = inside
            break
    if not frames:
        return None
    last = frames[-1]
    return "%s:%s in %s" % (last.group("file"), last.group("line"), last.group("function"))


def _evidence(rule, text):
    """The log line the rule matched, or the traceback's final line."""
    if rule is not None and rule.pattern is not None:
        found = rule.pattern.search(text)
        if found:
            start = text.rfind("\n", 0, found.start()) + 1
            end = text.find("\n", found.end())
            return text[start:end if end >= 0 else len(text)].strip()[:500]
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:500] if lines else None
