"""The on-disk prefix store, on its own: file format, damage, namespaces, manifests."""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import math
import os
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from hearth_engine.cache import store as store_module
from hearth_engine.cache.store import ManifestEntry, PrefixStore, prefix_key

NS = "tiny:float32:abc"
OTHER = "tiny:bfloat16:abc"
TOKENS = list(range(1000, 1040))


def kv_for(tokens: list[int], dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """A ``[L, 2, H, T, D]`` KV with distinct values everywhere."""
    n = len(tokens)
    return torch.arange(2 * 2 * 3 * n * 4, dtype=torch.float32).view(2, 2, 3, n, 4).to(dtype)


def saved(tmp_path: Path, ns: str = NS, tokens: list[int] = TOKENS) -> tuple[PrefixStore, Path]:
    store = PrefixStore(tmp_path)
    assert store.save(ns, tokens, kv_for(tokens))
    return store, store.path_for(ns, prefix_key(ns, tokens))


def data_start(path: Path) -> int:
    return 8 + int.from_bytes(path.read_bytes()[:8], "little")


# ---------------------------------------------------------------------- round trips


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_save_then_load_round_trips(tmp_path: Path, dtype: torch.dtype) -> None:
    store = PrefixStore(tmp_path)
    kv = kv_for(TOKENS, dtype)
    assert store.save(NS, TOKENS, kv)
    loaded = store.load(NS, TOKENS)
    assert loaded is not None and loaded.dtype == dtype and torch.equal(loaded, kv)
    by_key = store.load_by_key(NS, prefix_key(NS, TOKENS))
    assert by_key is not None
    assert by_key[0] == TOKENS and torch.equal(by_key[1], kv)
    assert store.load(NS, TOKENS[:-1]) is None  # another prefix: absent


def test_segments_are_written_as_pieces_and_load_as_one_tensor(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pin's cached segments go to disk without being concatenated first."""
    kv = kv_for(TOKENS)
    segments = [kv[:, :, :, :7].clone(), kv[:, :, :, 7:30].clone(), kv[:, :, :, 30:]]
    store = PrefixStore(tmp_path)

    def no_cat(*args: object, **kwargs: object) -> None:
        raise AssertionError("save concatenated the segments")

    monkeypatch.setattr(torch, "cat", no_cat)
    assert store.save(NS, TOKENS, segments)
    monkeypatch.undo()
    path = store.path_for(NS, prefix_key(NS, TOKENS))
    header = json.loads(path.read_bytes()[8 : data_start(path)])
    assert [header[f"kv.{i}"]["shape"][3] for i in range(3)] == [7, 23, 10]
    loaded = store.load(NS, TOKENS)
    assert loaded is not None and torch.equal(loaded, kv)


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="counts threads in /proc")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_writing_a_pin_starts_no_openmp_pool_on_the_writing_thread(
    tmp_path: Path, dtype: torch.dtype
) -> None:
    """The store's I/O thread copies a pin's strided segments without torch's parallel
    kernels: a thread that runs one keeps an OpenMP pool of its own, and a second pool on
    the cores makes the worker's threads sleep between every step's parallel regions (a
    warm prefill took 85 instead of 65 ms on 2 cores, with a prefix store, as the add-on
    runs). The segment is large enough that torch's copy would run on its pool."""
    tokens = list(range(4096))
    pool = torch.randn(2, 2, 3, len(tokens) + 64, 64).to(dtype)
    segment = pool[:, :, :, 64:]  # a strided view of the pool, as the cache keeps it
    store = PrefixStore(tmp_path)
    with ThreadPoolExecutor(1) as io, _torch_threads(2):
        io.submit(lambda: None).result()  # the writing thread exists
        before = _threads()
        assert io.submit(store.save, NS, tokens, [segment]).result()
        assert _threads() == before
    loaded = store.load(NS, tokens)
    assert loaded is not None and torch.equal(loaded, segment)


@settings(max_examples=60, deadline=None)
@given(
    shape=st.lists(st.integers(0, 5), min_size=0, max_size=5),
    cut=st.integers(0, 4),
    transpose=st.booleans(),
    dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.int64]),
)
# A [1, 1] view with a stride of 2 in its last dimension: torch calls it contiguous as
# it is, so the expected bytes come from a fresh copy.
@example(shape=[1, 2], cut=2, transpose=True, dtype=torch.float32)
def test_a_tensors_runs_are_its_bytes_in_order(
    shape: list[int], cut: int, transpose: bool, dtype: torch.dtype
) -> None:
    """Whatever the view (sliced, transposed, empty), the runs written are the tensor's
    bytes in C order: those of its contiguous copy."""
    tensor = torch.arange(max(1, math.prod(shape)) * 2).to(dtype)[: math.prod(shape)]
    tensor = tensor.view(shape)
    if tensor.dim() >= 2 and transpose:
        tensor = tensor.transpose(0, -1)
    if tensor.dim() >= 1:
        tensor = tensor[..., : max(0, tensor.shape[-1] - cut)] if cut < 2 else tensor[: cut - 1]
    written = b"".join(bytes(run) for run in store_module._runs_for_writing(tensor))
    flat = torch.empty(tensor.numel(), dtype=tensor.dtype).copy_(tensor.reshape(-1))
    expected = flat.view(torch.uint8).numpy().tobytes()
    assert written == expected


@contextlib.contextmanager
def _torch_threads(count: int) -> Iterator[None]:
    """torch's threads for new threads' pools, as on a box of ``count`` cores or more."""
    old = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(old)


def test_segments_that_do_not_cover_the_tokens_are_refused(tmp_path: Path) -> None:
    store = PrefixStore(tmp_path)
    with pytest.raises(ValueError, match="cover"):
        store.save(NS, TOKENS, [kv_for(TOKENS)[:, :, :, :10]])
    with pytest.raises(ValueError, match="differ"):
        store.save(NS, TOKENS, [kv_for(TOKENS[:10]), kv_for(TOKENS[10:], torch.bfloat16)])


def test_a_load_opens_the_file_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Regression: a load read the header, then the whole file (and load_by_key twice)."""
    store, _ = saved(tmp_path)
    opened: list[object] = []
    real = store_module.safe_open

    def counting(*args: object, **kwargs: object) -> object:
        opened.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(store_module, "safe_open", counting)
    monkeypatch.setattr("builtins.open", None)  # any other read of the file would fail
    assert store.load(NS, TOKENS) is not None
    assert len(opened) == 1
    assert store.load_by_key(NS, prefix_key(NS, TOKENS)) is not None
    assert len(opened) == 2


# ---------------------------------------------------------------------- damaged files


def _set_header_length(data: bytes, length: int) -> bytes:
    return length.to_bytes(8, "little") + data[8:]


def _replace_in_header(data: bytes, old: bytes, new: bytes) -> bytes:
    end = 8 + int.from_bytes(data[:8], "little")
    header = data[8:end].replace(old, new, 1)
    return len(header).to_bytes(8, "little") + header + data[end:]


DAMAGE = {
    # Regression: OverflowError from read(header_len) escaped and killed the engine.
    "garbage header length": lambda d: b"\xff" * 8 + d[8:],
    "header longer than the file": lambda d: _set_header_length(d, len(d)),
    "header length zero": lambda d: _set_header_length(d, 0),
    "bad JSON": lambda d: d[:8] + b"[" + d[9:],
    "wrong dtype": lambda d: _replace_in_header(d, b'"F32"', b'"F16"'),
    "wrong shape": lambda d: _replace_in_header(d, b"[2,2,3,40,4]", b"[2,2,3,4,40]"),
    "wrong token count": lambda d: _replace_in_header(d, b'"n_tokens":"40"', b'"n_tokens":"39"'),
    "missing metadata": lambda d: _replace_in_header(d, b'"__metadata__"', b'"__metadataX"'),
    "truncated data": lambda d: d[: len(d) - 100],
    "truncated header": lambda d: d[:20],
    "empty": lambda d: b"",
    "extra bytes": lambda d: d + b"\0" * 16,
    "flipped KV byte": lambda d: d[:-50] + bytes([d[-50] ^ 0x01]) + d[-49:],
}


@pytest.mark.parametrize("how", sorted(DAMAGE))
@pytest.mark.parametrize("by_key", [False, True])
def test_a_damaged_file_is_logged_ignored_and_discarded(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, how: str, by_key: bool
) -> None:
    store, path = saved(tmp_path)
    path.write_bytes(DAMAGE[how](path.read_bytes()))
    caplog.set_level(logging.WARNING)
    if by_key:
        assert store.load_by_key(NS, path.stem) is None
    else:
        assert store.load(NS, TOKENS) is None
    assert f"Ignoring prefix store file {path.name}" in caplog.text
    assert not path.exists()  # discarded: the next save rebuilds it
    assert store.save(NS, TOKENS, kv_for(TOKENS))
    assert store.load(NS, TOKENS) is not None


def test_flipped_kv_bytes_fail_the_checksum(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Regression: flipped KV bytes loaded silently."""
    store, path = saved(tmp_path)
    data = bytearray(path.read_bytes())
    data[data_start(path) + 8 * len(TOKENS) + 123] ^= 0x10  # inside kv.0
    path.write_bytes(bytes(data))
    caplog.set_level(logging.WARNING)
    assert store.load(NS, TOKENS) is None
    assert "checksum mismatch" in caplog.text
    assert not path.exists()


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    edits=st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), max_size=4),
    cut=st.one_of(st.none(), st.integers(0, 10**6)),
    tail=st.binary(max_size=16),
)
def test_no_corruption_makes_a_load_raise(
    tmp_path_factory: pytest.TempPathFactory,
    edits: list[tuple[int, int]],
    cut: int | None,
    tail: bytes,
) -> None:
    store, path = saved(tmp_path_factory.mktemp("fuzz"))
    data = bytearray(path.read_bytes())
    for at, value in edits:
        data[at % len(data)] = value
    if cut is not None:
        data = data[: cut % (len(data) + 1)]
    path.write_bytes(bytes(data) + tail)
    for loaded in (store.load(NS, TOKENS), store.load_by_key(NS, path.stem)):
        # Either the damage is harmless (say, header padding) and the data is intact,
        # or the file is refused.
        assert loaded is None or torch.equal(
            loaded if isinstance(loaded, torch.Tensor) else loaded[1], kv_for(TOKENS)
        )


@settings(
    max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.one_of(st.binary(max_size=64), st.text(max_size=64).map(str.encode)))
def test_no_manifest_makes_read_manifest_raise(
    tmp_path_factory: pytest.TempPathFactory, data: bytes
) -> None:
    store = PrefixStore(tmp_path_factory.mktemp("manifest"))
    store.folder(NS).mkdir()
    (store.folder(NS) / "pins.json").write_bytes(data)
    assert store.read_manifest(NS) == []
    assert store.next_version(NS) == 1


def _manifest(**fields: object) -> str:
    return json.dumps({"format": "hearth-kv/2", "namespace": NS, **fields})


@pytest.mark.parametrize(
    "manifest",
    [
        "[" * 100_000,
        _manifest(pins=3),
        _manifest(pins=[1]),
        _manifest(pins=[{"key": "a" * 64}]),
        _manifest(version="9", pins=[]),
    ],
)
def test_malformed_manifests_are_ignored(tmp_path: Path, manifest: str) -> None:
    store = PrefixStore(tmp_path)
    store.folder(NS).mkdir()
    (store.folder(NS) / "pins.json").write_text(manifest)
    assert store.read_manifest(NS) == []
    assert store.next_version(NS) == 1


# ---------------------------------------------------------------------- write failures


@pytest.mark.parametrize(
    ("code", "reason"),
    [(errno.ENOSPC, "disk full"), (errno.EROFS, "read-only"), (errno.EACCES, "permission denied")],
)
def test_a_failed_write_warns_once_and_leaves_no_file(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    code: int,
    reason: str,
) -> None:
    store = PrefixStore(tmp_path)

    def failing_fsync(fd: int) -> None:
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(os, "fsync", failing_fsync)
    caplog.set_level(logging.WARNING)
    assert not store.save(NS, TOKENS, kv_for(TOKENS))
    assert not store.save(NS, TOKENS[:20], [kv_for(TOKENS[:20])])
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and reason in warnings[0] and "cannot write" in warnings[0]
    left = [p.name for p in store.folder(NS).iterdir() if p.name != ".lock"]
    assert left == []  # no temporary file left


# ---------------------------------------------------------------------- namespaces


def _pin(store: PrefixStore, ns: str, tokens: list[int], name: str) -> ManifestEntry:
    assert store.save(ns, tokens, kv_for(tokens))
    entry = ManifestEntry(name, prefix_key(ns, tokens), len(tokens))
    version = store.next_version(ns)
    assert store.write_manifest(ns, [entry], version)
    store.prune(ns, {entry.key}, version)
    return entry


def test_one_namespace_never_deletes_another_ones_files(tmp_path: Path) -> None:
    """Regression: after a --dtype change, the other namespace's manifest pruned every file."""
    store = PrefixStore(tmp_path)
    first = _pin(store, NS, TOKENS, "house")
    second = _pin(store, OTHER, TOKENS, "house")
    version = store.next_version(NS)
    assert store.write_manifest(NS, [], version)  # the pin of NS is removed
    store.prune(NS, set(), version)
    assert not store.path_for(NS, first.key).exists()
    assert store.path_for(OTHER, second.key).exists()
    # A restart with the other dtype finds its pin as it left it.
    again = PrefixStore(tmp_path)
    assert again.read_manifest(OTHER) == [second]
    loaded = again.load_by_key(OTHER, second.key)
    assert loaded is not None and loaded[0] == TOKENS


def test_files_of_the_older_flat_layout_are_deleted(tmp_path: Path) -> None:
    legacy = tmp_path / f"{'0' * 64}.safetensors"
    legacy.write_bytes(b"old")
    (tmp_path / "pins.json").write_text('{"namespace": "x", "pins": []}')
    store = PrefixStore(tmp_path)
    _pin(store, NS, TOKENS, "house")
    assert not legacy.exists() and not (tmp_path / "pins.json").exists()
    assert store.read_manifest(NS) == [ManifestEntry("house", prefix_key(NS, TOKENS), 40)]


# ---------------------------------------------------------------------- manifest order


def test_an_older_snapshot_never_overwrites_a_newer_one(tmp_path: Path) -> None:
    """Regression: snapshots reached the I/O thread out of order; a removed pin came back."""
    store = PrefixStore(tmp_path)
    a, b = TOKENS[:20], TOKENS[20:]
    for tokens in (a, b):
        assert store.save(NS, tokens, kv_for(tokens))
    entry_a = ManifestEntry("a", prefix_key(NS, a), 20)
    entry_b = ManifestEntry("b", prefix_key(NS, b), 20)
    older = store.next_version(NS)  # snapshot: pins a and b
    newer = store.next_version(NS)  # snapshot: pin b removed
    assert store.write_manifest(NS, [entry_a], newer)
    store.prune(NS, {entry_a.key}, newer)
    assert not store.write_manifest(NS, [entry_a, entry_b], older)  # lands late: ignored
    store.prune(NS, {entry_a.key, entry_b.key}, older)  # ignored too
    assert store.read_manifest(NS) == [entry_a]
    assert not store.path_for(NS, entry_b.key).exists()
    # The order holds across restarts: a new store continues from the version on disk.
    again = PrefixStore(tmp_path)
    assert again.next_version(NS) > newer
    with pytest.raises(ValueError, match="next_version"):
        again.write_manifest(NS, [], newer + 10)


def test_prune_keeps_a_file_saved_after_its_snapshot(tmp_path: Path) -> None:
    """A snapshot taken before a pin was saved cannot list it; its prune must keep it."""
    store = PrefixStore(tmp_path)
    version = store.next_version(NS)  # snapshot without the new pin
    assert store.save(NS, TOKENS, kv_for(TOKENS))  # the new pin's file
    assert store.write_manifest(NS, [], version)
    store.prune(NS, set(), version)
    assert store.load(NS, TOKENS) is not None
    later = store.next_version(NS)  # a snapshot after the pin went away
    assert store.write_manifest(NS, [], later)
    store.prune(NS, set(), later)
    assert store.load(NS, TOKENS) is None


def test_prune_keeps_the_file_of_a_pin_made_again(tmp_path: Path) -> None:
    """A pin removed and made again: a snapshot from between the two must not delete it."""
    store = PrefixStore(tmp_path)
    _pin(store, NS, TOKENS, "house")
    removed = store.next_version(NS)  # snapshot after the pin was removed
    assert store.save(NS, TOKENS, kv_for(TOKENS))  # the pin is made again: file exists
    assert store.write_manifest(NS, [], removed)
    store.prune(NS, set(), removed)
    assert store.load(NS, TOKENS) is not None


# ---------------------------------------------------------------------- keeping what to keep
# Issue 26: the store deleted files it should have kept.


def _files(store: PrefixStore, ns: str = NS) -> set[str]:
    return {p.name for p in store.folder(ns).glob("*.safetensors")}


@pytest.mark.parametrize("code", [errno.EIO, errno.EMFILE, errno.ENOSPC, errno.EACCES])
def test_a_transient_read_error_keeps_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, code: int
) -> None:
    """Regression: ``_read`` deleted a file on any OSError, a passing EIO or EMFILE too."""
    store, path = saved(tmp_path)

    def failing_open(*args: object, **kwargs: object) -> None:
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(store_module, "safe_open", failing_open)
    caplog.set_level(logging.WARNING)
    assert store.load(NS, TOKENS) is None
    assert store.load_by_key(NS, path.stem) is None
    assert path.exists()
    assert os.strerror(code) in caplog.text
    monkeypatch.undo()
    loaded = store.load(NS, TOKENS)  # the error has passed: the file is as it was
    assert loaded is not None and torch.equal(loaded, kv_for(TOKENS))


def test_a_transient_read_error_is_counted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    failures: list[int] = []
    store = PrefixStore(tmp_path, on_failure=lambda: failures.append(1))
    assert store.save(NS, TOKENS, kv_for(TOKENS))

    def failing_open(*args: object, **kwargs: object) -> None:
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(store_module, "safe_open", failing_open)
    assert store.load(NS, TOKENS) is None
    assert failures == [1]


MANIFEST_DAMAGE = {
    "empty (a crash before the data reached the disk)": b"",
    "truncated": b'{"format": "hearth-kv/2", "pins": [',
    "not JSON": b"\x00\xff garbage",
    "another format": json.dumps({"format": "hearth-kv/9", "namespace": NS, "pins": []}).encode(),
    "a malformed pin": json.dumps(
        {"format": "hearth-kv/2", "namespace": NS, "version": 3, "pins": [{"key": "a" * 64}]}
    ).encode(),
}


@pytest.mark.parametrize("how", sorted(MANIFEST_DAMAGE))
def test_an_unreadable_manifest_keeps_every_file(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, how: str
) -> None:
    """Regression: a broken pins.json read as "no pins", and the next manifest pruned every
    stored file. Now every file stays, and the broken manifest is moved aside, not
    overwritten."""
    first = PrefixStore(tmp_path)
    entry = _pin(first, NS, TOKENS, "house")
    del first  # the previous run
    manifest = PrefixStore(tmp_path).folder(NS) / "pins.json"
    manifest.write_bytes(MANIFEST_DAMAGE[how])
    caplog.set_level(logging.WARNING)
    store = PrefixStore(tmp_path)
    other = TOKENS[:20]
    assert store.save(NS, other, kv_for(other))  # a pin of this run
    version = store.next_version(NS)
    new = ManifestEntry("other", prefix_key(NS, other), 20)
    assert store.write_manifest(NS, [new], version)
    store.prune(NS, {new.key}, version)
    assert _files(store) == {f"{entry.key}.safetensors", f"{new.key}.safetensors"}
    (aside,) = store.folder(NS).glob("pins.json.corrupt-*")
    assert aside.read_bytes() == MANIFEST_DAMAGE[how]
    assert store.read_manifest(NS) == [new]
    warnings = [r.getMessage() for r in caplog.records if "pins.json" in r.getMessage()]
    assert len(warnings) == 1 and "keeping every stored file" in warnings[0]


def test_a_missing_manifest_keeps_the_files_it_would_have_listed(tmp_path: Path) -> None:
    """KV files without a manifest (lost in a crash, or deleted): a run cannot tell which
    are pins, so it deletes none of them."""
    assert PrefixStore(tmp_path).save(NS, TOKENS, kv_for(TOKENS))
    store = PrefixStore(tmp_path)
    version = store.next_version(NS)
    assert store.write_manifest(NS, [], version)
    store.prune(NS, set(), version)
    assert store.load(NS, TOKENS) is not None


def test_a_manifest_is_synced_before_and_after_its_rename(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression: pins.json was renamed into place unsynced; after a power cut it could be
    empty (and an empty manifest pruned every file)."""
    store = PrefixStore(tmp_path)
    assert store.save(NS, TOKENS, kv_for(TOKENS))
    events: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        events.append("fsync folder" if stat.S_ISDIR(os.fstat(fd).st_mode) else "fsync file")
        real_fsync(fd)

    def replace(src: str, dst: str | Path) -> None:
        events.append(f"rename to {Path(dst).name}")
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    version = store.next_version(NS)
    assert store.write_manifest(NS, [ManifestEntry("house", prefix_key(NS, TOKENS), 40)], version)
    assert events == ["fsync file", "rename to pins.json", "fsync folder"]


def test_a_second_store_on_a_folder_reads_but_never_writes_or_deletes(
    tmp_path: Path,
) -> None:
    """Regression: two engines on one folder pruned each other's files. The second one
    (here a second store in the same process: ``flock`` locks are per open file) restores
    what is there, and writes, prunes and deletes nothing."""
    owner = PrefixStore(tmp_path)
    entry = _pin(owner, NS, TOKENS, "house")
    second = PrefixStore(tmp_path)
    assert second.read_manifest(NS) == [entry]
    loaded = second.load_by_key(NS, entry.key)
    assert loaded is not None and loaded[0] == TOKENS
    other = TOKENS[:20]
    assert not second.save(NS, other, kv_for(other))
    version = second.next_version(NS)
    assert not second.write_manifest(NS, [], version)
    second.prune(NS, set(), version)
    assert _files(owner) == {f"{entry.key}.safetensors"}
    assert owner.read_manifest(NS) == [entry]
    # A file the second store cannot use stays too: the owner decides.
    damaged = owner.path_for(NS, prefix_key(NS, other))
    damaged.write_bytes(b"\0" * 8)
    assert second.load(NS, other) is None
    assert damaged.exists()
    # The owner works on, and once it closes, the folder is free for another store.
    assert owner.load(NS, other) is None and not damaged.exists()
    owner.close()
    third = PrefixStore(tmp_path)
    assert third.save(NS, other, kv_for(other))


def test_another_process_holding_the_folder_makes_a_store_read_only(tmp_path: Path) -> None:
    """The lock is between processes too, and a process that dies lets go of it."""
    store = PrefixStore(tmp_path)
    folder = store.folder(NS)
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; from pathlib import Path;"
            "from hearth_engine.cache.store_lock import FolderLock;"
            "lock = FolderLock(Path(sys.argv[1])); print(lock.acquire(), flush=True);"
            "sys.stdin.read()",
            str(folder),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "True"
        assert not store.save(NS, TOKENS, kv_for(TOKENS))
    finally:
        holder.kill()
        holder.wait()
    again = PrefixStore(tmp_path)  # the holder died: its lock is gone
    assert again.save(NS, TOKENS, kv_for(TOKENS))


def test_stale_temporary_files_are_swept_at_start(tmp_path: Path) -> None:
    """Regression: ``.tmp-*`` files left by a crash mid-write stayed forever. Only files
    older than this store are stale: a newer one is someone's write in progress."""
    folder = PrefixStore(tmp_path).folder(NS)
    folder.mkdir(parents=True)
    stale = folder / ".tmp-crashed.safetensors"
    stale_manifest = folder / ".tmp-crashed.json"
    fresh = folder / ".tmp-in-progress.safetensors"
    for path in (stale, stale_manifest, fresh):
        path.write_bytes(b"partial")
    now = time.time()
    for path in (stale, stale_manifest):
        os.utime(path, (now - 3600, now - 3600))
    os.utime(fresh, (now + 3600, now + 3600))
    store = PrefixStore(tmp_path)
    assert store.save(NS, TOKENS, kv_for(TOKENS))
    assert sorted(p.name for p in folder.glob(".tmp-*")) == [fresh.name]
