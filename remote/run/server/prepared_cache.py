"""prepare-data's output, kept once per dataset, tokenizer and settings in the user's workdir (stdlib only).

prepare-data renders every conversation through the server (docs/server-mode.md §1), so it cannot start
before /health, and it took 27-30 s of 512 samples on an H200 (issue 26). Its output depends only on
what the key below hashes, so a run whose key is cached links the cached directory into its own and
skips the step:

* the dataset's content: a file's bytes, or a directory's *.json/*.jsonl files (names and bytes, in
  speculators' order: 0.9.0 data_generation/preprocessing.py load_raw_dataset); a dataset that is no
  local file (`hf:`, `hf://`) has no key, and is prepared as before;
* the model's tokenizer and chat-template files (TOKENIZER_FILES), which the server renders with, and
  config.json, from which vLLM and transformers choose the tokenizer's class;
* prepare-data's settings that change its rows: seq_length, max_samples, seed;
* the speculators release and the bytes of its files that make the rows (PREPARE_SOURCES: a patch or a
  development install changes the key too), the datasets release (its shuffle), and the vLLM release (its
  render endpoint; specrig's vLLM patchsets change no rendering).

<workdir>/prepared-cache/ (CACHE) is its user's alone (0700, files 0600), as runs/ is:

    <key>/prepared/       the dataset as prepare-data wrote it (state.json, dataset_info.json, *.arrow)
    <key>/key.json        what the key hashed, for whoever reads the cache
    .partial-<key>-...    an entry being written: renamed to <key> only once whole, so two runs
                          preparing the same key at once never see each other's half: the second
                          rename finds <key> there and its copy is dropped (either is the same data)
    file-hashes.json      sha256 of files already hashed, by (device, inode, size, mtime, ctime): a large
                          dataset is read once, not at every run

Entries are hard links to the run's own files (a copy across filesystems): nothing writes them after
prepare-data, and a run's prepared directory is removed without touching the cache's.
"""
import errno
import hashlib
import json
import os
import shutil
import uuid

from base import atomic, pkgmeta, prepared
from base.rundir import PRIVATE_DIR

#: The key's layout: a change of what it hashes, or how, starts a new cache.
FORMAT = 1
CACHE = "prepared-cache"
DATA, KEY_FILE, HASHES = "prepared", "key.json", "file-hashes.json"
#: The model directory's files that rendering depends on: the tokenizer's (every tokenizer class's own
#: vocabulary files), the chat template in each of its homes, config.json (which tokenizer class, which
#: renderer) and remote tokenizer code.
TOKENIZER_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "added_tokens.json", "tokenizer.model", "vocab.json", "vocab.txt", "merges.txt",
                   "spiece.model", "sentencepiece.bpe.model", "chat_template.json", "chat_template.jinja",
                   "processor_config.json", "preprocessor_config.json")
TOKENIZER_SUFFIXES = (".tiktoken", ".jinja")
TOKENIZER_PREFIXES = ("tokenization_", "tokenizer")
TEMPLATE_DIR = "additional_chat_templates"
#: speculators' files whose code makes prepare-data's rows (0.8.0-0.9.0: the command, the rendering and
#: masking, the render client), relative to its site-packages.
PREPARE_SOURCES = ("speculators/cli/prepare_data.py", "speculators/data_generation/preprocessing.py",
                   "speculators/data_generation/render_client.py")
CHUNK = 1 << 20


class NoKey(Exception):
    """The prepared data of these settings cannot be cached; the message says why."""


def cache_root(workdir):
    return os.path.join(os.path.expanduser(workdir), CACHE)


def key_settings(settings, **releases):
    """What a plan keeps for the key (plan.py): the paths and settings prepare-data's rows depend on, and
    `releases` (speculators, speculators_sources, datasets, vllm)."""
    return dict({"dataset": settings["dataset"], "model": settings["model"], "seq_length": settings["max_length"],
                 "max_samples": settings["max_samples"], "seed": settings["seed"]}, **releases)


def key_of(settings, vllm_version):
    """What the prepared data's cache key hashes (key_settings), the releases read in this, the client's,
    environment: its speculators (and the digest of its sources) and datasets; the server's vLLM."""
    speculators = pkgmeta.installed("speculators")
    return key_settings(
        settings, speculators=speculators and speculators["version"], vllm=vllm_version,
        speculators_sources=sources_digest(speculators["root"]) if speculators else None,
        datasets=pkgmeta.versions(("datasets",))["datasets"])


def sources_digest(site_packages):
    """sha256 over PREPARE_SOURCES in `site_packages` (a missing one counts as missing)."""
    digest = hashlib.sha256()
    for name in PREPARE_SOURCES:
        try:
            with open(os.path.join(site_packages, name), "rb") as handle:
                data = hashlib.sha256(handle.read()).hexdigest()
        except OSError:
            data = "missing"
        digest.update(("%s %s\n" % (name, data)).encode())
    return digest.hexdigest()


def key_inputs(wanted, hashes=None, cwd=None):
    """Everything the key hashes, from a plan's key_settings `wanted`: the files as (name, sha256). NoKey
    when the dataset or the model is not a local path. `hashes`: a FileHashes (or None: hash every file)."""
    hasher = hashes or FileHashes(None)
    dataset = os.path.join(cwd or os.getcwd(), os.path.expanduser(wanted["dataset"]))
    model = os.path.expanduser(wanted["model"])
    if os.path.isfile(dataset):
        data = [["", hasher.sha256(dataset)]]  # a file's name changes nothing prepare-data writes
    elif os.path.isdir(dataset):
        data = [[name, hasher.sha256(os.path.join(dataset, name))] for name in dataset_files(dataset)]
        if not data:
            raise NoKey("the dataset directory %s holds no .json/.jsonl file" % dataset)
    else:
        raise NoKey("the dataset %s is no local file or directory" % wanted["dataset"])
    if not os.path.isdir(model):
        raise NoKey("the model %s is no local directory" % wanted["model"])
    tokenizer = [[name, hasher.sha256(os.path.join(model, name))] for name in tokenizer_files(model)]
    hasher.save()
    settings = {name: value for name, value in wanted.items() if name not in ("dataset", "model")}
    return dict(settings, format=FORMAT, dataset=data, tokenizer=tokenizer)


def cache_key(inputs):
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()[:32]


def dataset_files(directory):
    """A directory dataset's files, relative, in the order speculators loads them (sorted *.json, *.jsonl)."""
    found = []
    for root, _dirs, names in os.walk(directory):
        found += [os.path.join(root, n) for n in names if n.endswith((".json", ".jsonl"))]
    return sorted(os.path.relpath(path, directory) for path in found)


def tokenizer_files(model):
    """The model directory's files that rendering reads (TOKENIZER_FILES and their kin), relative, sorted."""
    names = [name for name in os.listdir(model) if os.path.isfile(os.path.join(model, name)) and (
        name in TOKENIZER_FILES or name.endswith(TOKENIZER_SUFFIXES) or name.startswith(TOKENIZER_PREFIXES))]
    templates = os.path.join(model, TEMPLATE_DIR)
    if os.path.isdir(templates):
        names += [os.path.join(TEMPLATE_DIR, name) for name in os.listdir(templates)
                  if os.path.isfile(os.path.join(templates, name))]
    return sorted(names)


class FileHashes:
    """sha256 of files, remembered in `path` (None: not remembered) by what changes with any write to them:
    (device, inode, size, mtime, ctime); a file whose record differs is read again."""

    def __init__(self, path):
        self.path, self.changed = path, False
        self.known = atomic.read_json(path, {}) if path else {}

    def sha256(self, path):
        real = os.path.realpath(path)
        st = os.stat(real)
        identity = [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]
        known = self.known.get(real)
        if known and known["identity"] == identity:
            return known["sha256"]
        digest = hashlib.sha256()
        with open(real, "rb") as handle:
            for chunk in iter(lambda: handle.read(CHUNK), b""):
                digest.update(chunk)
        self.known[real] = {"identity": identity, "sha256": digest.hexdigest()}
        self.changed = True
        return digest.hexdigest()

    def save(self):
        if self.path and self.changed:
            atomic.write_json(self.path, self.known)
            self.changed = False


class PreparedCache:
    """The cache under `root` (cache_root)."""

    def __init__(self, root):
        self.root = root

    def make(self):
        os.makedirs(self.root, mode=PRIVATE_DIR, exist_ok=True)
        os.chmod(self.root, PRIVATE_DIR)

    def hashes(self):
        self.make()
        return FileHashes(os.path.join(self.root, HASHES))

    def data(self, key):
        return os.path.join(self.root, key, DATA)

    def lookup(self, key):
        """The cached prepared directory of `key`, or None. An entry that is not whole (removed files) is
        dropped, so that a new one can take its place."""
        entry = os.path.join(self.root, key)
        if not os.path.isdir(entry):
            return None
        if prepared.complete(self.data(key)):
            return self.data(key)
        stale = os.path.join(self.root, ".stale-%s-%s" % (key, uuid.uuid4().hex[:8]))
        try:
            os.rename(entry, stale)
        except OSError:
            return None
        shutil.rmtree(stale, ignore_errors=True)
        return None

    def publish(self, key, source, inputs):
        """Keep the whole prepared directory `source` as `key`'s: True when this call made the entry, False
        when one was there already (another run published the same key first)."""
        if os.path.isdir(os.path.join(self.root, key)):
            return False
        self.make()
        partial = os.path.join(self.root, ".partial-%s-%d-%s" % (key, os.getpid(), uuid.uuid4().hex[:8]))
        try:
            os.mkdir(partial, PRIVATE_DIR)
            link_tree(source, os.path.join(partial, DATA))
            atomic.write_json(os.path.join(partial, KEY_FILE), inputs)
            try:
                os.rename(partial, os.path.join(self.root, key))
            except OSError as exc:
                if exc.errno in (errno.EEXIST, errno.ENOTEMPTY):
                    return False
                raise
            return True
        finally:
            shutil.rmtree(partial, ignore_errors=True)

    def link_into(self, key, target):
        """`key`'s cached directory as the run's prepared directory `target` (not there yet): linked into a
        partial directory beside it, renamed into place once whole. False when the entry went meanwhile."""
        source = self.lookup(key)
        if source is None:
            return False
        partial = "%s.partial-%s" % (target.rstrip("/"), uuid.uuid4().hex[:8])
        try:
            link_tree(source, partial)
            os.rename(partial, target)
        except FileNotFoundError:
            return False  # the entry was removed while it was linked
        finally:
            shutil.rmtree(partial, ignore_errors=True)
        return True


def link_tree(source, target):
    """`source`'s files (one level, as prepare-data writes them) into a new directory `target`: hard links,
    else copies (another filesystem, or one without hard links); each file fsynced with its directory."""
    os.mkdir(target, PRIVATE_DIR)
    for name in sorted(os.listdir(source)):
        src, dst = os.path.join(source, name), os.path.join(target, name)
        if not os.path.isfile(src):
            continue
        try:
            os.link(src, dst)
        except OSError as exc:
            if exc.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP, errno.EACCES):
                raise
            shutil.copyfile(src, dst)
            os.chmod(dst, 0o600)
            with open(dst, "rb") as handle:
                os.fsync(handle.fileno())
    fd = os.open(target, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
