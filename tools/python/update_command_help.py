#!/usr/bin/env python3
"""update_command_help.py: rewrites the "Options of every command" part of docs/commands.md from the binary's own
`--help` texts (`qatserve help`, then `qatserve COMMAND --help` for each command `help` lists, in its order), so the
reference cannot drift from the binary. ctest `Docs.CommandsAndFlagsMatchTheBinary` fails until it is run after a
command or flag changes.

usage: update_command_help.py QATSERVE [--doc docs/commands.md]
"""
import argparse
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HEADING = "## Options of every command"
INTRO = ("The `--help` text of each command (`qatserve help`, `qatserve COMMAND --help`) as the binary prints it, "
         "written by\n`tools/python/update_command_help.py build/qatserve`.")


def help_text(binary, *args):
    # argv[0] "qatserve", so the usage lines read as a user types them, wherever the binary was built
    out = subprocess.run(["qatserve", *args], executable=binary, capture_output=True, text=True, check=True).stdout
    return out.rstrip("\n")


def commands(overview):
    listed = overview.split("Subcommands:\n", 1)[1]
    return [m[1] for m in re.finditer(r"^  ([a-z][a-z0-9-]*) ", listed, re.M)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("qatserve", type=Path)
    ap.add_argument("--doc", type=Path, default=ROOT / "docs" / "commands.md")
    a = ap.parse_args()
    overview = help_text(a.qatserve.resolve(), "help")
    parts = [HEADING, "", INTRO, "", "### `qatserve`", "", "```text", overview, "```"]
    for command in commands(overview):
        parts += ["", f"### `qatserve {command}`", "", "```text", help_text(a.qatserve.resolve(), command, "--help"),
                  "```"]
    doc = a.doc.read_text()
    start = doc.index(HEADING)
    rest = doc.find("\n## ", start + len(HEADING))  # a section after this one stays
    tail = "\n" + doc[rest:].lstrip("\n") if rest >= 0 else ""
    a.doc.write_text(doc[:start] + "\n".join(parts) + "\n" + tail)
    print(f"{a.doc}: {len(commands(overview)) + 1} help texts")


if __name__ == "__main__":
    main()
