"""The man pages (docs/man/) against what they describe, so that they cannot drift: every command, option and
-o option of `ckptfs --help` / `ckptfs mount --help` / `ckptfs cat --help` is in ckptfs(1) and every option there is in the help;
the -o options the parser accepts (src/cli/mount_command.cpp) are the help's and the man page's; the exit
codes are include/ckptfs/error.hpp's and docs/exit-codes.md's; the environment variables are those the
sources read; the options mount.ckptfs drops are in mount.ckptfs(8); both render without a groff warning.

A new option: add it to the help text (src/cli/main.cpp kUsage, or kHelp in src/cli/mount_command.cpp or cat_command.cpp), to
docs/man/ckptfs.1 (OPTIONS or MOUNT OPTIONS, a .TP entry) and to completion/ckptfs.bash; this test and
test_completion.py name what is missing where."""
import os
import re
import shutil
import subprocess

import pytest

import helpers as H

REPO = H.REPO
MAN1 = os.path.join(REPO, "docs", "man", "ckptfs.1")
MAN8 = os.path.join(REPO, "docs", "man", "mount.ckptfs.8")
# -o spellings the parser takes that are FUSE's own, not ckptfs options (the man page's paragraph after the list).
FUSE_OWN = {"ro", "rw", "defaults"}

pytestmark = pytest.mark.skipif(not shutil.which("groff"), reason="groff is not installed (groff-base)")


def read(path):
    with open(path) as f:
        return f.read()


def help_texts(ckptfs_bin):
    """(`ckptfs --help`, `ckptfs mount --help`, `ckptfs cat --help`)."""
    out = []
    for args in (["--help"], ["mount", "--help"], ["cat", "--help"]):
        proc = H.run([ckptfs_bin, *args])
        H.assert_ok(proc)
        out.append(proc.stdout)
    return out


def rendered(path):
    """The page as man shows it, in ASCII (plain hyphens), without overstriking."""
    proc = subprocess.run(["groff", "-man", "-Tascii", "-P-cbou", path], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def long_options(text):
    return set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*[a-z0-9]", text))


def short_options(text):
    """-x options: in [...] of a synopsis, or first on a line of an option list."""
    return set(re.findall(r"\[(-[a-zA-Z])\b", text)) | set(re.findall(r"^\s+(-[a-zA-Z])\s", text, re.M))


def help_commands(main_help):
    return set(re.findall(r"^\s+ckptfs ([a-z]+) ", main_help, re.M))


def mount_option_block(mount_help):
    """The -o list of `ckptfs mount --help`: from the `-o opt,...` line to the blank line after it."""
    return mount_help[mount_help.index("\n  -o opt,..."):].split("\n\n")[0]


def parser_mount_options():
    """{name: takes a value} of every -o option src/cli/mount_command.cpp's add_mount_option accepts."""
    src = read(os.path.join(REPO, "src", "cli", "mount_command.cpp"))
    body = src[src.index("void add_mount_option"):]
    body = body[:body.index("\n}\n")]
    found = {m.group(1): m.group(2) == "=" for m in re.finditer(r'option(?:\.starts_with\(| == )"([a-z0-9_]+)(=?)"', body)}
    assert len(found) >= 15, f"the parser's -o options were not found in mount_command.cpp: {found}"
    return {k: v for k, v in found.items() if k not in FUSE_OWN}


def section(roff, title):
    """The roff source of section `title` (up to the next .SH)."""
    m = re.search(rf'^\.SH "?{re.escape(title)}"?\n(.*?)(?=^\.SH |\Z)', roff, re.M | re.S)
    assert m, f"no section {title}"
    return m.group(1)


def plain(roff_line):
    """The words of one roff line without its font macros and escapes: '.BI threads= N' -> 'threads= N'."""
    line = re.sub(r"^\.(?:B|I|BI|IB|BR|RB|IR|RI)\s+", "", roff_line)
    line = re.sub(r"\\f[BIRP]", "", line).replace("\\-", "-").replace('"', "")
    return line.strip()


def tags(roff, title):
    """The first word of every .TP entry's tag in section `title`."""
    lines = section(roff, title).split("\n")
    return [plain(lines[i + 1]).split()[0] for i, l in enumerate(lines) if l == ".TP"]


def test_man_pages_render_without_warnings():
    for page in (MAN1, MAN8):
        proc = subprocess.run(["groff", "-man", "-ww", "-z", page], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0 and not proc.stderr, f"{page}: {proc.stderr}"


def test_man_page_version_is_the_projects():
    """Each page's .TH names the version of CMakeLists.txt's project()."""
    version = re.search(r"project\(ckptfs VERSION ([0-9.]+)", read(os.path.join(REPO, "CMakeLists.txt"))).group(1)
    for page in (MAN1, MAN8):
        th = next(l for l in read(page).split("\n") if l.startswith(".TH "))
        assert f'"ckptfs {version}"' in th, f"{page}: {th} (the project is {version})"


def test_every_command_and_option_of_the_help_is_in_the_man_page_and_back(ckptfs_bin):
    main_help, mount_help, cat_help = help_texts(ckptfs_bin)
    man = rendered(MAN1)
    commands = help_commands(main_help)
    assert {"mount", "inspect", "export", "cat", "index"} <= commands, commands
    assert set(tags(read(MAN1), "COMMANDS")) == commands, f"ckptfs.1 COMMANDS against ckptfs --help's {commands}"
    helped = long_options(main_help + mount_help + cat_help)
    assert {"--tag", "--strict", "--json", "--help", "--version", "--endpoint", "--output", "--shard-size"} <= helped
    assert not helped - long_options(man), f"in --help, not in ckptfs.1: {sorted(helped - long_options(man))}"
    assert not long_options(man) - helped, f"in ckptfs.1, not in --help: {sorted(long_options(man) - helped)}"
    shorts = short_options(main_help + mount_help + cat_help)
    assert {"-o", "-f", "-d"} <= shorts, shorts
    documented = set(tags(read(MAN1), "OPTIONS"))
    assert not shorts - documented, f"short options of --help missing from ckptfs.1 OPTIONS: {shorts - documented}"
    assert not long_options(" ".join(documented)) - helped


def test_mount_options_are_the_parsers_the_helps_and_the_man_pages(ckptfs_bin):
    accepted = parser_mount_options()
    block = mount_option_block(help_texts(ckptfs_bin)[1])
    spelt = {k: re.escape(k) + ("=" if valued else r"(?![\w=])") for k, valued in accepted.items()}
    unhelped = [k for k, pattern in spelt.items() if not re.search(r"(?<![\w=])" + pattern, block)]
    assert not unhelped, f"-o options the parser accepts that `ckptfs mount --help` does not list: {unhelped}"
    man = {t.split("=")[0]: "=" in t for t in tags(read(MAN1), "MOUNT OPTIONS")}
    assert man == accepted, (f"ckptfs.1 MOUNT OPTIONS: missing {sorted(set(accepted) - set(man))}, "
                             f"not accepted {sorted(set(man) - set(accepted))}, "
                             f"'=' differs {sorted(k for k in man if k in accepted and man[k] != accepted[k])}")


def test_exit_codes_are_error_hpps_and_the_docs():
    enum = read(os.path.join(REPO, "include", "ckptfs", "error.hpp"))
    codes = {int(c) for c in re.findall(r"^\s+\w+ = (\d+),", enum, re.M)}
    assert codes == set(range(8)), codes
    assert {int(t) for t in tags(read(MAN1), "EXIT STATUS")} == codes
    table = {int(c) for c in re.findall(r"^\| (\d+) \|", read(os.path.join(REPO, "docs", "exit-codes.md")), re.M)}
    assert table == codes


def test_environment_is_what_the_sources_read():
    """Every variable the sources read (getenv, and the S3 configuration's lookups) is documented, and only those."""
    read_vars = set()
    for root, _, files in os.walk(os.path.join(REPO, "src")):
        for name in files:
            if name.endswith(".cpp") and not name.endswith(("_test.cpp", "_fuzz.cpp", "_probe.cpp")):
                for line in read(os.path.join(root, name)).split("\n"):
                    if "getenv(" in line or "first_set(env" in line:
                        read_vars |= set(re.findall(r'"([A-Z][A-Z0-9_]{2,})"', line))
    assert {"XDG_CACHE_HOME", "HOME", "AWS_ACCESS_KEY_ID", "AWS_PROFILE"} <= read_vars, read_vars
    documented = set()
    for tag_line in tags(read(MAN1), "ENVIRONMENT"):
        documented.add(tag_line.rstrip(","))
    body = section(read(MAN1), "ENVIRONMENT")
    lines = body.split("\n")
    for i, l in enumerate(lines):  # a tag may name several variables: '.BR A ", " B'
        if l == ".TP":
            documented |= set(re.findall(r"\b[A-Z][A-Z0-9_]{2,}\b", plain(lines[i + 1])))
    assert documented == read_vars, f"missing {sorted(read_vars - documented)}, not read {sorted(documented - read_vars)}"


def test_mount_helper_page_names_what_the_helper_drops():
    script = read(os.path.join(REPO, "src", "cli", "mount.ckptfs"))
    dropped_line = next(l for l in script.split("\n") if "nofail" in l and ")" in l)
    dropped = [d.strip() for d in dropped_line.split(")")[0].split("|")]
    assert "_netdev" in dropped and "x-*" in dropped, dropped
    page = rendered(MAN8)
    missing = [d for d in dropped if d not in page]
    assert not missing, f"options mount.ckptfs drops that mount.ckptfs.8 does not name: {missing}"
    assert "ckptfs(1)" in page and "fstab" in page
