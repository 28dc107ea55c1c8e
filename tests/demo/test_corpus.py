"""The demo corpus: which files it takes, how it splits them, and the windows it deals."""

import hashlib

import numpy as np
import pytest
import torch

from slowlink.demo.corpus import (
    SEPARATOR,
    WINDOW,
    Corpus,
    TrainWindows,
    heldout_windows,
    is_validation,
    load_corpus,
    source_files,
)


@pytest.fixture
def tree(tmp_path):
    """A fake stdlib: kept files, excluded folders at several depths, and a file that is not Python."""
    files = {
        "a.py": b"alpha",
        "b.py": b"beta",  # sha1("b.py") % 20 == 0: a validation file
        "pkg/x.py": b"ex",
        "pkg/tests/t.py": b"no",
        "test/t.py": b"no",
        "tests/t.py": b"no",
        "idlelib/i.py": b"no",
        "site-packages/s.py": b"no",
        "pkg/__pycache__/x.py": b"no",
        "pkg/notes.txt": b"no",
        "test_top.py": b"kept: a test-like name outside a test folder",
    }
    for path, data in files.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_bytes(data)
    return tmp_path


def test_source_files_skip_test_idle_site_packages_and_cache_folders_and_come_sorted(tree):
    assert source_files(tree) == ["a.py", "b.py", "pkg/x.py", "test_top.py"]


def test_the_real_stdlib_listing_has_no_excluded_folder():
    import sysconfig

    paths = source_files(sysconfig.get_paths()["stdlib"])
    assert len(paths) > 300
    banned = {"test", "tests", "idlelib", "site-packages", "__pycache__"}
    assert not [p for p in paths if banned & set(p.split("/")[:-1])]


def test_validation_is_sha1_of_the_relative_path_mod_20():
    # Worked out by hand: these digests are 0 mod 20, the others are not.
    assert int(hashlib.sha1(b"b.py").hexdigest(), 16) % 20 == 0
    assert [p for p in ["a.py", "b.py", "c.py", "f57.py", "pkg/x.py"] if is_validation(p)] == [
        "b.py",
        "f57.py",
    ]
    assert is_validation("base64.py") and not is_validation("os.py")


def test_the_split_is_disjoint_ordered_and_joined_with_0x1e(tree):
    corpus = load_corpus(str(tree))
    assert corpus.train.tobytes() == SEPARATOR.join(
        [b"alpha", b"ex", b"kept: a test-like name outside a test folder"]
    )
    assert corpus.val.tobytes() == b"beta"
    whole = SEPARATOR.join([b"alpha", b"beta", b"ex", b"kept: a test-like name outside a test folder"])
    assert corpus.size == len(whole)
    assert corpus.sha256 == hashlib.sha256(whole).hexdigest()
    assert (corpus.files, corpus.val_files) == (4, 1)


def test_the_stdlib_corpus_is_cached_and_about_5_percent_validation():
    corpus = load_corpus()
    assert load_corpus() is corpus
    assert 5e6 < corpus.size < 40e6
    assert corpus.size == len(corpus.train) + len(corpus.val) + 1  # one separator joins the two halves' files
    assert 0.02 < corpus.val_files / corpus.files < 0.10
    assert corpus.train.dtype == np.uint8 and len(corpus.sha256) == 64


def synthetic(length: int) -> Corpus:
    # Byte i is i mod 251, so a window is a true slice exactly when each byte is the previous one plus 1.
    data = (np.arange(length) % 251).astype(np.uint8)
    return Corpus(train=data, val=data[:300], sha256="", size=length, files=1, val_files=0, python="")


def test_training_windows_are_in_bounds_contiguous_and_cover_every_start():
    corpus = synthetic(200)  # 200 - 129 + 1 = 72 possible starts
    batch = TrainWindows(corpus, seed=3).next_batch(2000)
    assert batch.shape == (2000, WINDOW) and batch.dtype == torch.int64
    assert torch.all((batch[:, 1:] - batch[:, :-1]) % 251 == 1)
    assert set(batch[:, 0].tolist()) == set(range(72))


def test_training_windows_repeat_for_the_same_seed_and_node_and_differ_across_nodes():
    corpus = synthetic(100_000)
    first = TrainWindows(corpus, node=0, nodes=2, seed=7)
    again = TrainWindows(corpus, node=0, nodes=2, seed=7)
    other = TrainWindows(corpus, node=1, nodes=2, seed=7)
    batches = [first.next_batch(16) for _ in range(3)]
    assert all(torch.equal(b, again.next_batch(16)) for b in batches)
    assert not torch.equal(batches[0], other.next_batch(16))
    assert not torch.equal(batches[0], batches[1])  # a stream, not one batch repeated
    assert not torch.equal(batches[0], TrainWindows(corpus, node=0, nodes=2, seed=8).next_batch(16))


def test_non_iid_nodes_draw_only_from_their_own_block():
    data = np.zeros(10_000, dtype=np.uint8)
    data[5_000:] = 1  # the second half is ones: node 1's block
    corpus = Corpus(train=data, val=data, sha256="", size=len(data), files=1, val_files=0, python="")
    node0 = TrainWindows(corpus, node=0, nodes=2, iid=False).next_batch(500)
    node1 = TrainWindows(corpus, node=1, nodes=2, iid=False).next_batch(500)
    # 9872 possible starts: node 0 starts below 4936, in the zeros; node 1 starts at 4936 or later, so its
    # windows end at 5064 or later, in the ones.
    assert node0[:, 0].max() == 0 and node1[:, -1].min() == 1
    with pytest.raises(ValueError, match="node index 2"):
        TrainWindows(corpus, node=2, nodes=2, iid=False)


def test_heldout_windows_are_fixed_and_come_from_the_validation_split():
    corpus = load_corpus()
    windows = heldout_windows(corpus, 64)
    assert windows.shape == (64, WINDOW)
    assert torch.equal(windows, heldout_windows(corpus, 64))
    assert windows[0].tolist() == corpus.val[:WINDOW].tolist()
    assert windows[-1].tolist() == corpus.val[-WINDOW:].tolist()
