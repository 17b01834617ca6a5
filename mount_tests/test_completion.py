"""completion/ckptfs.bash, run as bash runs it on a TAB: sourced, COMP_LINE / COMP_POINT / COMP_WORDS /
COMP_CWORD set as readline sets them (words split at COMP_WORDBREAKS' = and : too), _ckptfs called, COMPREPLY
read. Its commands, options and -o options are checked against `ckptfs --help`, `ckptfs mount --help`,
`ckptfs cat --help` and the -o parser (as test_man_pages.py reads them), its tags against the example
checkpoint's own tag dirs, its VIEW_PATHs for cat by cat itself."""
import os
import re
import subprocess

import pytest

import helpers as H
import test_man_pages as M

COMPLETION = os.path.join(H.REPO, "completion", "ckptfs.bash")
EXAMPLE = os.path.join("examples", "deepspeed-zero3-bf16")  # relative to the repo, where completions run
BREAKS = "\"'@><=;|&(:"  # bash's default COMP_WORDBREAKS, past the blanks
FUSE_PASSED = {"allow_other", "default_permissions", "fsname="}  # offered too: libfuse's own


def readline_words(line):
    """COMP_WORDS and COMP_CWORD for `line` with the cursor at its end, as readline splits it."""
    words = []
    for blank_separated in line.split():
        words += [w for w in re.split(f"([{re.escape(BREAKS)}])", blank_separated) if w]
    if not line or line[-1].isspace():
        words.append("")
    return words, len(words) - 1


def complete(line, ckptfs_bin):
    """COMPREPLY for a TAB at the end of `line`, its first word replaced by the binary under test."""
    line = line.replace("ckptfs", ckptfs_bin, 1)
    words, cword = readline_words(line)
    script = f"""source {COMPLETION}
COMP_WORDBREAKS=$WORDBREAKS
COMP_LINE=$1; COMP_POINT=${{#1}}; shift
COMP_WORDS=("$@"); COMP_CWORD={cword}
_ckptfs
printf '%s\\n' "${{COMPREPLY[@]}}"
"""
    proc = subprocess.run(["bash", "-c", script, "bash", line, *words], capture_output=True, text=True, timeout=60,
                          cwd=H.REPO, env=dict(os.environ, WORDBREAKS=" \t\n" + BREAKS))
    assert proc.returncode == 0 and not proc.stderr, proc.stderr
    return [w for w in proc.stdout.split("\n") if w]


@pytest.fixture(scope="module")
def helps(ckptfs_bin):
    return M.help_texts(ckptfs_bin)


def command_options(main_help, command):
    """The long options of `command`'s line in `ckptfs --help`, and the s3:// options it takes."""
    line = next(l for l in main_help.split("\n") if l.startswith(f"  ckptfs {command} "))
    s3 = next(l for l in main_help.split("\n") if "--endpoint" in l)
    return M.long_options(line) | M.long_options(s3)


def test_the_completion_is_registered():
    proc = subprocess.run(["bash", "-c", f"source {COMPLETION}; complete -p ckptfs"], capture_output=True, text=True,
                          timeout=60)
    assert proc.stdout.strip() == "complete -F _ckptfs ckptfs", proc.stdout + proc.stderr


def test_commands_are_the_helps(ckptfs_bin, helps):
    offered = {w for w in complete("ckptfs ", ckptfs_bin) if not os.path.exists(os.path.join(H.REPO, w))}
    assert offered == M.help_commands(helps[0]) | {"help"}, offered
    assert set(complete("ckptfs ins", ckptfs_bin)) == {"inspect"}
    assert set(complete("ckptfs --v", ckptfs_bin)) == {"--version"}


@pytest.mark.parametrize("command", ["inspect", "export", "index"])
def test_options_of_each_command_are_the_helps(ckptfs_bin, helps, command):
    expected = command_options(helps[0], command)
    assert {"--tag", "--strict", "--endpoint"} <= expected
    assert set(complete(f"ckptfs {command} {EXAMPLE} --", ckptfs_bin)) == expected


def test_cat_options_are_cat_helps(ckptfs_bin, helps):
    usage = helps[2].split("\n\n")[0]
    expected = M.long_options(usage)
    assert {"--tag", "--strict", "--output", "--endpoint"} <= expected, usage
    assert expected <= set(complete(f"ckptfs cat {EXAMPLE} model.safetensors --", ckptfs_bin)) <= expected | {"--help"}
    assert {"-o", "--output"} <= set(complete(f"ckptfs cat {EXAMPLE} -", ckptfs_bin))


def test_cat_view_paths_are_files_cat_reads(ckptfs_bin):
    """Every VIEW_PATH offered is a file `ckptfs cat` writes, or a folder of the tree (offered with its /);
    the latest tag's views are at the root and every tag's under tags/<tag>/."""
    verl = os.path.join("examples", "verl-fsdp2-ws2")
    offered = complete(f"ckptfs cat {verl} ", ckptfs_bin)
    for tag in step_dirs(verl):
        assert f"tags/{tag}/fp32/model.safetensors" in offered, (tag, offered)
    assert {"ckptfs.json", "model.safetensors", "fp32/pytorch_model.bin", "fp32/model.safetensors"} <= set(offered)
    for view in offered:
        proc = subprocess.run([ckptfs_bin, "cat", verl, view], capture_output=True, timeout=120, cwd=H.REPO)
        assert proc.returncode == 0 and proc.stdout, (view, proc.returncode, proc.stderr)
    folders = complete(f"ckptfs cat {EXAMPLE} uni", ckptfs_bin)
    assert folders == ["universal/"]
    proc = subprocess.run([ckptfs_bin, "cat", EXAMPLE, "universal"], capture_output=True, text=True, timeout=120,
                          cwd=H.REPO)
    assert proc.returncode == 2 and "is a directory" in proc.stderr, proc.stderr
    assert complete(f"ckptfs cat {verl} --tag global_step_1 fp32/m", ckptfs_bin) == ["fp32/model.safetensors"]
    assert complete(f"ckptfs cat {verl} tags/global_step_1/fp32/m", ckptfs_bin) == [
        "tags/global_step_1/fp32/model.safetensors"]
    assert complete(f"ckptfs cat {verl} model.safetensors ", ckptfs_bin) == []  # nothing after VIEW_PATH


def test_cat_output_is_a_file(ckptfs_bin, tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "model.safetensors").write_bytes(b"")
    expected = {f"{tmp_path}/out", f"{tmp_path}/model.safetensors"}
    for option in ("-o ", "--output ", "--output="):
        line = f"ckptfs cat {EXAMPLE} model.safetensors {option}{tmp_path}/"
        assert set(complete(line, ckptfs_bin)) == expected, line


def test_mount_options_are_the_mount_helps(ckptfs_bin, helps):
    offered = set(complete(f"ckptfs mount {EXAMPLE} /tmp -", ckptfs_bin))
    documented = M.short_options(helps[1]) | M.long_options(helps[1])
    assert {"-o", "-f", "-d", "--tag"} <= documented
    assert documented <= offered <= documented | {"--help"}, offered


def test_o_names_are_the_parsers(ckptfs_bin):
    accepted = {name + ("=" if valued else "") for name, valued in M.parser_mount_options().items()}
    offered = set(complete(f"ckptfs {EXAMPLE} /tmp -o ", ckptfs_bin))
    assert offered - FUSE_PASSED == accepted, (sorted(accepted - offered), sorted(offered - FUSE_PASSED - accepted))
    # after a comma: the list so far kept, only the text after readline's last break (the '=') replaced
    assert complete(f"ckptfs {EXAMPLE} /tmp -o threads=4,pre", ckptfs_bin) == ["4,prefetch="]
    assert complete(f"ckptfs mount {EXAMPLE} /tmp -o strict,s3_c", ckptfs_bin) == ["strict,s3_connections="]


def step_dirs(example):
    """An example's tags, from its own files: its step dirs."""
    root = os.path.join(H.REPO, example)
    return sorted(d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d)))


def test_tags_are_read_from_src(ckptfs_bin):
    tags = step_dirs(EXAMPLE)
    assert tags == ["global_step3"]
    for line in (f"ckptfs inspect {EXAMPLE} --tag ", f"ckptfs export {EXAMPLE} /tmp/out --tag ",
                 f"ckptfs {EXAMPLE} /tmp --tag glo", f"ckptfs index {EXAMPLE} --tag=",
                 f"ckptfs mount {EXAMPLE} /tmp -o strict,tag="):
        assert complete(line, ckptfs_bin) == tags, line
    verl = os.path.join("examples", "verl-fsdp2-ws2")  # two steps
    assert complete(f"ckptfs {verl} /tmp -o tag=", ckptfs_bin) == step_dirs(verl)
    assert complete(f"ckptfs inspect {verl} --tag global_step_2", ckptfs_bin) == ["global_step_2"]
    assert complete(f"ckptfs inspect {EXAMPLE} --tag nothing", ckptfs_bin) == []
    assert complete("ckptfs inspect /nonexistent --tag ", ckptfs_bin) == []


def test_paths_for_src_mnt_and_out(ckptfs_bin, tmp_path):
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "model.pt").write_bytes(b"")
    (tmp_path / "notes.txt").write_bytes(b"")
    # SRC: directories and lone weights files
    assert set(complete(f"ckptfs inspect {tmp_path}/", ckptfs_bin)) == {f"{tmp_path}/ckpt", f"{tmp_path}/model.pt"}
    assert set(complete(f"ckptfs {tmp_path}/", ckptfs_bin)) == {f"{tmp_path}/ckpt", f"{tmp_path}/model.pt"}
    # MNT, OUT, --cache DIR: directories only
    for line in (f"ckptfs mount {EXAMPLE} {tmp_path}/", f"ckptfs export {EXAMPLE} {tmp_path}/",
                 f"ckptfs index {EXAMPLE} --cache {tmp_path}/", f"ckptfs {EXAMPLE} {tmp_path}/"):
        assert complete(line, ckptfs_bin) == [f"{tmp_path}/ckpt"], line
    assert complete(f"ckptfs {EXAMPLE} /tmp -o index_cache={tmp_path}/", ckptfs_bin) == [f"{tmp_path}/ckpt/"]
    # nothing after the last positional
    assert complete(f"ckptfs inspect {EXAMPLE} {tmp_path}/", ckptfs_bin) == []
