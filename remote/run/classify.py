"""Why a driver attempt failed, from its log and exit status, by the rules in classify_rules.json.

The rules are data: id, pattern -> kind, retryable, explanation, advice. The evidence is taken from
the root cause, so that what is printed around it (a resource_tracker warning at exit, a worker's
shutdown notes) does not decide. The places searched, in order:

1. the driver's own statement of why it stopped (`extract_driver: refused: ...`, `... disk full: ...`);
2. the root cause: the first exception of the driver's last chain ("The above exception was the
   direct cause of the following exception:"), or, when that exception only points at another
   process's traceback ("See stack trace for root cause"), the traceback a vLLM worker printed
   before it, one log line at a time behind a `(Worker pid=N) ERROR ... [multiproc_executor.py:N]`
   prefix;
3. the driver's last chain to the end of the log;
4. the whole log.
"""
import json
import os
import re
import signal

RULES_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "classify_rules.json")
TRACEBACK = "Traceback (most recent call last):"
#: A frame of a traceback and its source line (absent for code without a file, e.g. File "<string>").
FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<function>\S+)(?:\n(?P<code>[ \t]+.*))?$',
                   re.MULTILINE)
#: What vLLM puts before each line a worker or the engine core logs: "(Worker pid=N) " or
#: "(EngineCore pid=N) " from the multiprocessing executor, then the logger's "ERROR 11-30 09:06:36
#: [multiproc_executor.py:783] ". A traceback logged by a worker carries it on every line.
LOG_PREFIX = re.compile(r"^(?:\([\w-]+ pid=\d+\) )?(?:(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) "
                        r"\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)? \[[^\]\n]*\] )?", re.MULTILINE)
#: How Python joins the tracebacks of one chain; the earlier one is the cause of the later.
CHAIN_LINK = re.compile(r"^(?:The above exception was the direct cause of the following exception:"
                        r"|During handling of the above exception, another exception occurred:)$")
#: vLLM's exceptions that only point at a traceback printed above by another process: "See stack trace
#: for root cause", "See root cause above", "please check the stack trace above for the root cause".
POINTS_AT_ROOT_CAUSE = re.compile(r"root cause", re.IGNORECASE)
#: An exception's line at the start of a line: above a traceback that points at a root cause, it is that cause
#: even where its own traceback's first line was cut off (a log's tail).
EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(?:Error|Exception): ", re.MULTILINE)
#: The driver's own last word on a failure (exit statuses 1-3 of extract_driver.py).
DRIVER_STATEMENT = re.compile(r"^extract_driver: (?:refused|disk full): .*$", re.MULTILINE)
#: What differs between two attempts failing the same way: addresses, pids, times, sizes, counts.
VARYING = re.compile(r"0x[0-9a-fA-F]+|\d+")
RULE_ID = re.compile(r"^[a-z0-9]+(?:-[a-z0-9]+)*$")


class _Defaults(dict):
    """str.format_map mapping that leaves unknown fields visible instead of failing."""

    def __missing__(self, key):
        return "{" + key + "}"


class Rule:
    def __init__(self, *, id, kind, retryable, explain, advice, log=None, signal=None, only_root_cause=False):
        # (the table's keys)
        if not isinstance(id, str) or not RULE_ID.match(id):
            raise ValueError("rule %r: id must be kebab-case, got %r" % (kind, id))
        if not isinstance(retryable, bool):
            raise ValueError("rule %r: retryable must be true or false, got %r" % (id, retryable))
        if (log is None) == (signal is None):
            raise ValueError("rule %r: give exactly one of `log` and `signal`" % (id,))
        self.id = id
        self.kind = kind
        self.retryable = retryable
        self.explain = explain
        self.advice = advice
        self.pattern = re.compile(log, re.MULTILINE) if log is not None else None
        self.signals = frozenset(signal or ())
        #: Matched only in the root cause's text: a message that other processes' errors may precede (vLLM's
        #: "Engine core initialization failed" follows an engine's own traceback, or none when it was killed).
        self.only_root_cause = bool(only_root_cause)

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
    rules = [Rule(**rule) for rule in table["rules"]]
    ids = [rule.id for rule in rules]
    repeated = sorted({i for i in ids if ids.count(i) > 1})
    if repeated:
        raise ValueError("%s: rule ids must be unique: %s" % (path, ", ".join(repeated)))
    return rules, table["fallback"], table.get("caller_from", [])


def signal_name(exit_status):
    """'SIGKILL' for -9 (Popen's way of saying killed by a signal), None for a normal exit."""
    if exit_status is None or exit_status >= 0:
        return None
    try:
        return signal.Signals(-exit_status).name
    except ValueError:
        return "signal %d" % -exit_status


def without_log_prefixes(log_text):
    """The log with vLLM's per-line prefixes removed: a worker's traceback as it was raised."""
    return LOG_PREFIX.sub("", log_text)


def tracebacks(log_text):
    """Every traceback in the log, in order: [{"text", "start", "chained", "prefix"}], prefixes removed.

    A traceback is the lines with the prefix its first line had, up to the first blank one: lines of
    other processes printed meanwhile are left out. `chained` says it was raised while handling the
    one before it; `start` is its offset in without_log_prefixes(log_text).
    """
    found, offset, current, link_pending = [], 0, None, False
    for line in log_text.split("\n"):
        prefix = LOG_PREFIX.match(line).group(0)
        body = line[len(prefix):]
        if body.rstrip() == TRACEBACK:
            current = {"text": body + "\n", "start": offset, "chained": link_pending, "prefix": prefix}
            found.append(current)
            link_pending = False
        elif current is not None and prefix == current["prefix"]:
            if body.strip():
                current["text"] += body + "\n"
            else:
                current = None
        elif current is None and body.strip():
            link_pending = bool(CHAIN_LINK.match(body.strip()))
        offset += len(body) + 1
    return found


def _chain_start(found, index):
    """The index of the first traceback of the chain that found[index] belongs to."""
    while index > 0 and found[index]["chained"]:
        index -= 1
    return index


def exception_line(traceback_text):
    """The exception a traceback ends with: the first unindented line after its last frame; for a
    pydantic ValidationError with the two lines after it, which name the field."""
    frames = list(FRAME.finditer(traceback_text))
    rest = traceback_text[frames[-1].end():] if frames else traceback_text[len(TRACEBACK):]
    lines = [line for line in rest.splitlines() if line.strip() and not line[0].isspace()]
    if not lines:
        return None
    if "ValidationError" not in lines[0]:
        return lines[0].strip()
    following = rest[rest.find(lines[0]) + len(lines[0]):].strip().splitlines()[:2]
    return " ".join([lines[0].strip()] + [f.strip() for f in following if f.strip() and "errors.pydantic.dev" not in f])


def root_cause(log_text):
    """(root cause, the log's last chain): the first a traceback of tracebacks(), the second the same
    shape holding every traceback of the chain; (None, None) when the log has no traceback."""
    found = tracebacks(log_text)
    if not found:
        return None, None
    first = _chain_start(found, len(found) - 1)
    last_chain = {"text": "".join(t["text"] for t in found[first:]), "start": found[first]["start"]}
    pointing = any(POINTS_AT_ROOT_CAUSE.search(exception_line(t["text"]) or "") for t in found[first:])
    if pointing and first > 0:
        return found[_chain_start(found, first - 1)], last_chain
    return found[first], last_chain


def classify(log_text, exit_status, *, host="the host", subject="the driver", environment="python", rules=None):
    """{"kind", "rule", "retryable", "explain", "advice", "exit_status", "signal", "callee", "caller",
    "evidence", "port", "signature"}; `port` is the port a rule's match names (its group `port`), else None.
    `subject` is what failed, as the explanations name it (server mode: the
    vLLM server, or one of speculators' CLI steps), `environment` the hosts.yaml key of the
    interpreter it ran on (`python`, or the server's `server_python`)."""
    rules, fallback, caller_from = rules or load_rules()
    sig = signal_name(exit_status)
    text = without_log_prefixes(log_text)
    root, last_chain = root_cause(log_text)
    # A signal decides first: a killed process printed no traceback of its own death. Then the places
    # of the module's docstring, nearest to the cause first.
    places = [("", sig, False)] if sig else []
    places += [("\n".join(DRIVER_STATEMENT.findall(text)), None, False)] if DRIVER_STATEMENT.search(text) else []
    # A root cause that points at another above it, with an exception's line there, is not the root cause.
    own_root = root is not None and not (POINTS_AT_ROOT_CAUSE.search(exception_line(root["text"]) or "")
                                         and EXCEPTION_LINE.search(text[:root["start"]]))
    places += [(root["text"], None, own_root)] if root else []
    places += [(text[last_chain["start"]:], None, False)] if last_chain else []
    places += [(text, None, False)]
    matched, groups, matched_in = None, {}, None
    for place, sig_for_rule, is_root_cause in places:
        for rule in rules:
            if (rule.pattern is None) != (sig_for_rule is not None) or (rule.only_root_cause and not is_root_cause):
                continue
            found = rule.match(place, sig_for_rule)
            if found is not None:
                matched, groups, matched_in = rule, found, place
                break
        if matched:
            break
    fields = _Defaults(groups, host=host, signal=sig or "", exit_status=exit_status, subject=subject,
                      environment=environment)
    source = matched.__dict__ if matched else fallback
    result = {
        "kind": source["kind"],
        "rule": matched.id if matched else None,
        "retryable": source["retryable"],
        "explain": source["explain"].format_map(fields),
        "advice": source["advice"].format_map(fields),
        "exit_status": exit_status,
        "signal": sig,
        "callee": groups.get("callee"),
        "evidence": _evidence(matched, matched_in, root, text),
        "caller": _caller(root, last_chain, caller_from),
        "port": int(groups["port"]) if "port" in groups else None,
    }
    result["signature"] = signature(result)
    return result


def signature(failure):
    """What makes two failures the same one: kind, rule, callee and the evidence line, with what
    differs between attempts of one failure (pids, addresses, times, bytes free) left out; and the port
    a failure names (port-taken), which is no such detail: a port taken is a race when the next start's
    port differs (vLLM picks its own anew), and held for good when the same one is taken again."""
    evidence = VARYING.sub("#", failure.get("evidence") or "")
    port = " | port %d" % failure["port"] if failure.get("port") else ""
    return " | ".join(str(failure.get(key) or "-") for key in ("kind", "rule", "callee")) + " | " + evidence + port


def consumer_frame(traceback_texts, markers):
    """The last frame (a FRAME match) in the first of `markers`' paths that has one, looked for in
    each traceback in turn; None when none has such a frame."""
    for text in traceback_texts:
        frames = list(FRAME.finditer(text))
        for marker in markers:
            inside = [frame for frame in frames if marker in frame.group("file")]
            if inside:
                return inside[-1]
    return None


def _caller(root, last_chain, caller_from):
    """The call into vLLM that failed: the consumer's last frame (`caller_from`) in the root cause,
    else in the driver's last chain, else the root cause's last frame."""
    frame = consumer_frame([t["text"] for t in (root, last_chain) if t], caller_from)
    if frame is None and root is not None:
        frame = (list(FRAME.finditer(root["text"])) or [None])[-1]
    return _frame(frame) if frame else None


def _frame(frame):
    return "%s:%s in %s" % (frame.group("file"), frame.group("line"), frame.group("function"))


def _evidence(rule, matched_in, root, text):
    """The log line the rule matched, else the root cause's exception, else the log's last line."""
    if rule is not None and rule.pattern is not None:
        found = rule.pattern.search(matched_in)
        start = matched_in.rfind("\n", 0, found.start()) + 1
        end = matched_in.find("\n", found.end())
        return matched_in[start:end if end >= 0 else len(matched_in)].strip()[:500]
    if root is not None and exception_line(root["text"]):
        return exception_line(root["text"])[:500]
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1].strip()[:500] if lines else None
