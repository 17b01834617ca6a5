"""-o stats: ckptfs-stats.json at the mount's root holds the daemon's figures at each open (bytes served
per file so far), read with open()/json like any file though its bytes differ from one open to the next;
without the option the file is not there."""
import json
import os
from pathlib import Path

from mounting import mounted

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "megatron-tp2-pp2"


def stats(mnt):
    with open(os.path.join(mnt, "ckptfs-stats.json")) as f:
        return json.load(f)


def test_stats_file_counts_the_bytes_served_live(ckptfs_bin, tmp_path):
    with mounted(ckptfs_bin, EXAMPLE, tmp_path / "mnt", "-o", "stats") as mnt:
        assert "ckptfs-stats.json" in os.listdir(mnt)
        assert stats(mnt) == {"served": {}}, "nothing read yet"
        view = os.path.join(mnt, "model.safetensors")
        with open(view, "rb") as f:
            f.read(4096)
        first = stats(mnt)["served"]["model.safetensors"]
        size = os.path.getsize(view)
        assert 4096 <= first <= size, first  # the kernel may read ahead of the 4 KiB asked for
        with open(view, "rb") as f:
            while f.read(1 << 20):
                pass
        # each byte of the file answered once (the page cache keeps what was read before)
        assert stats(mnt)["served"]["model.safetensors"] == size
        assert "ckptfs-stats.json" not in stats(mnt)["served"], "the figures do not count themselves"


def test_without_the_option_there_is_no_stats_file(ckptfs_bin, tmp_path):
    with mounted(ckptfs_bin, EXAMPLE, tmp_path / "mnt") as mnt:
        assert "ckptfs-stats.json" not in os.listdir(mnt)
        assert not os.path.exists(os.path.join(mnt, "ckptfs-stats.json"))
