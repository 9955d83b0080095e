"""The engine's pieces on small sources: version ranges with nightlies, ast-located edits, patchset validation."""
import json
import re
import textwrap

import pytest

from base import versions
from patching import edits as patchedits
from patching import patchlib, patchset


@pytest.mark.parametrize("version, spec, expected", [
    ("0.16.0rc2.dev344+gea5f903f8", ["==0.16.*", "==0.17.*"], True),
    ("0.16.0", ["==0.16.*", "==0.17.*"], True),
    ("0.17.1.dev12+g1234567.cpu", ["==0.16.*", "==0.17.*"], True),
    ("0.16.0+cpu", "==0.16.*", True),
    ("0.18.0rc1.dev3", ["==0.16.*", "==0.17.*"], False),
    ("0.15.1", ["==0.16.*", "==0.17.*"], False),
    ("0.16.0rc2.dev344", ">=0.16.0.dev0,<0.18.0.dev0", True),
    ("0.16.0rc2.dev344", ">=0.16.0", False),  # a nightly of 0.16.0 comes before 0.16.0
    ("0.3.0", "==0.3.*", True),
    ("0.3.0", "~=0.3.0", True),
    ("0.4.0", "~=0.3.0", False),
    ("0.16.0", "!=0.16.0", False),
])
def test_version_ranges_include_nightlies(version, spec, expected):
    assert versions.in_range(version, spec) is expected


def test_pep440_ordering():
    ordered = ["0.16.0.dev0", "0.16.0a1", "0.16.0rc2.dev344", "0.16.0rc2", "0.16.0", "0.16.0.post1",
               "0.16.1.dev5", "0.17.0"]
    parsed = [versions.Version(v) for v in ordered]
    assert parsed == sorted(parsed) and versions.Version("0.16") == versions.Version("0.16.0")


@pytest.mark.parametrize("spec, message", [
    ("0.16", "'0.16' is not a version specifier"),
    (">=zero", "'zero' is not a PEP 440 version"),
    ([], "expected a specifier string"),
])
def test_bad_ranges_are_named(spec, message):
    with pytest.raises(versions.InvalidRange, match=message):
        versions.check_range(spec)


def edit(operation, fields, text, folder="."):
    text = textwrap.dedent(text)
    change = patchedits.build({operation: fields}, folder)
    source = patchlib.Source(text)
    state = change.state(source)
    return state, (change.apply(source) if state == patchlib.PENDING else None)


CALLS = """\
result = make(
    first=1,
    drop=2,
    last=3,
)
other = make(a, drop=b)
tail = make(a, drop=b)
"""


def test_remove_keyword_keeps_the_layout():
    state, new = edit("remove-keyword", {"call": "make", "keyword": "drop", "count": 3}, CALLS)
    assert state == patchlib.PENDING
    assert new == "result = make(\n    first=1,\n    last=3,\n)\nother = make(a)\ntail = make(a)\n"
    assert edit("remove-keyword", {"call": "make", "keyword": "drop", "count": 3}, new)[0] == patchlib.APPLIED


def test_count_mismatch_and_partial_application_are_conflicts():
    state, _ = edit("remove-keyword", {"call": "make", "keyword": "drop"}, CALLS)
    assert state.name == "conflict" and "expected 1 call to make(...), found 3" in state.reason
    half = CALLS.replace("other = make(a, drop=b)", "other = make(a)")
    state, _ = edit("remove-keyword", {"call": "make", "keyword": "drop", "count": 3}, half)
    assert state.name == "conflict" and "2 of 3 calls" in state.reason


@pytest.mark.parametrize("text, expected", [
    ("x = mod.Make(\n    a=1,\n    b=2,\n)\n", "x = mod.Make(\n    a=1,\n    b=2,\n    size=s.block,\n)\n"),
    ("x = Make(a, b)\n", "x = Make(a, b, size=s.block)\n"),
    ("x = Make()\n", "x = Make(size=s.block)\n"),
    ("x = Make(\n    a, b\n)\n", "x = Make(\n    a, b, size=s.block\n)\n"),
])
def test_add_keyword(text, expected):
    state, new = edit("add-keyword", {"call": "Make", "keyword": "size", "value": "s.block"}, text)
    assert state == patchlib.PENDING and new == expected


def test_add_keyword_already_passed_by_hand_counts_as_applied():
    state, _ = edit("add-keyword", {"call": "AutoTokenizer.from_pretrained", "keyword": "trust_remote_code",
                                    "value": "True"}, "t = AutoTokenizer.from_pretrained(p, trust_remote_code=1)\n")
    assert state == patchlib.APPLIED


def test_add_base_with_import():
    text = "from m import A\n\n\nclass C(\n    A, B\n):\n    x = 1\n"
    state, new = edit("add-base", {"class": "C", "base": "D", "import": {"from": "pkg.i", "name": "D"}}, text)
    assert new == "from m import A\nfrom pkg.i import D\n\n\nclass C(\n    A, B, D\n):\n    x = 1\n"
    assert edit("add-base", {"class": "C", "base": "D"}, new)[0] == patchlib.APPLIED


def test_rename_attribute_on_one_object_only():
    text = "y = self.old(x) + other.old(x)\n"
    state, new = edit("rename-attribute", {"attribute": "old", "to": "new", "object": "self"}, text)
    assert new == "y = self.new(x) + other.old(x)\n"


def test_replace_snippet_counts_occurrences():
    state, new = edit("replace-snippet", {"old": "a[0]\n", "new": "a\n"}, "x = a[0]\n")
    assert new == "x = a\n"
    state, _ = edit("replace-snippet", {"old": "a[0]\n", "new": "a\n"}, "x = a[0]\ny = a[0]\n")
    assert state.name == "conflict" and "occurs 2 times (expected 1)" in state.reason


def test_script_edit_adds_members(tmp_path):
    (tmp_path / "add.py").write_text(textwrap.dedent('''\
        """add a method"""
        from patching import patchlib

        def state(source):
            return patchlib.class_members_state(source, "C", ("m",), base="P")

        def apply(source):
            return patchlib.add_to_class(source, "C", "def m(self):\\n    return 1\\n", base="P", import_from="i")
        '''))
    state, new = edit("script", {"file": "add.py"}, "class C(B):\n    x = 1\n", folder=str(tmp_path))
    assert new == "from i import P\nclass C(B, P):\n    x = 1\n\n    def m(self):\n        return 1\n"
    assert edit("script", {"file": "add.py"}, new, folder=str(tmp_path))[0] == patchlib.APPLIED
    partly = "class C(B):\n    def m(self):\n        pass\n"
    assert edit("script", {"file": "add.py"}, partly, folder=str(tmp_path))[0].name == "conflict"


def test_a_script_written_before_patchlib_moved_still_imports_it_by_its_old_name(tmp_path):
    (tmp_path / "old.py").write_text("import patchlib\n\n\ndef state(source):\n    return patchlib.State('applied')"
                                     "\n\n\ndef apply(source):\n    return source.text\n")
    assert edit("script", {"file": "old.py"}, "x = 1\n", folder=str(tmp_path))[0] == patchlib.APPLIED


@pytest.mark.parametrize("mutate, message", [
    (lambda d: d["patches"][0].update(id="Bad Id"), "patches[0].id: 'Bad Id' is not a patch id"),
    (lambda d: d["patches"][0].update(edit={"remove-keyword": {"call": "f"}}), "missing field 'keyword'"),
    (lambda d: d["patches"][0].update(edit={"frobnicate": {}}), "unknown operation 'frobnicate'"),
    (lambda d: d["applies-to"].update(vllm="0.16"), "applies-to: vllm: '0.16' is not a version specifier"),
    (lambda d: d["patches"][0]["target"].update(path="../x.py"), "target.path: '../x.py'"),
    (lambda d: d["patches"].append(dict(d["patches"][0])), "patch id 'p' is used twice"),
    (lambda d: d["patches"][0].update(when={"platform": "tpu"}), "platform: 'tpu' is not one of cpu, cuda"),
])
def test_bad_patchsets_are_named(tmp_path, mutate, message):
    data = {"name": "ps", "description": "d", "applies-to": {"speculators": "==0.3.*", "vllm": "==0.16.*"},
            "patches": [{"id": "p", "target": {"package": "speculators", "path": "speculators/x.py"},
                         "fixes": ["behaviour:x"], "description": "d",
                         "edit": {"remove-keyword": {"call": "f", "keyword": "k"}}}]}
    mutate(data)
    (tmp_path / "ps").mkdir()
    (tmp_path / "ps" / "patchset.json").write_text(json.dumps(data))
    with pytest.raises(patchset.InvalidPatchset, match=re.escape(message)):
        patchset.load_all(str(tmp_path))


def test_every_shipped_patchset_is_valid_as_the_host_loads_it(tmp_path):
    """Every folder of patchsets/, through the bundle (YAML turned into JSON) and the engine's loader."""
    import io
    import tarfile

    from specrig.transport.bundle import current_bundle
    from support.paths import REPO

    with tarfile.open(fileobj=io.BytesIO(current_bundle().tar_bytes), mode="r:gz") as tar:
        tar.extractall(tmp_path, filter="data")
    shipped = sorted(p.name for p in (REPO / "patchsets").iterdir() if (p / "patchset.yaml").is_file())
    loaded = patchset.load_all(str(tmp_path / "patchsets"))
    assert sorted(loaded) == shipped and len(shipped) >= 2
    for name in shipped:
        assert loaded[name].patches, name
        assert all(patch.description and patch.edit.describe() for patch in loaded[name].patches), name