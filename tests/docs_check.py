#!/usr/bin/env python3
"""The documentation's commands and links: README.md and docs/*.md.

  python3 tests/docs_check.py --static   markers, links, options, paths (seconds)
  python3 tests/docs_check.py --run      the runnable blocks, in order (minutes)
  python3 tests/docs_check.py            both
  ... [FILE.md ...]                      only these files

Every ```sh block carries a marker on the line before it (blank lines between
are allowed):

  <!-- runnable -->                 run: each file's runnable blocks in order, in
                                    one fresh temporary directory (build/ holds
                                    links to the built programs, tests/ is the
                                    repository's), each block by `sh -e`: any
                                    failing command fails the check
  <!-- options-checked: WHY -->     not run (WHY: a download, minutes, PyTorch);
                                    every option of every build/PROGRAM in it is
                                    one PROGRAM takes (its --help, else its
                                    source), every `make T` is a target make
                                    knows (`make -n T`), every repository path
                                    exists
  <!-- not-checked: WHY -->         nothing checked (for options that do not
                                    exist yet; say so in WHY)

Static checks, besides the options-checked blocks: the options of runnable
blocks and of inline `build/PROGRAM --option` and `make TARGET` spans, every --option in an
inline span known to some program, no path into ../shared (a clone has
none), every relative link's file and #anchor, every docs page linked from
the README, and the README at most 450 lines. Exit 0 when all pass, 1 when
one fails, 77 (a skip) when build/train is not built.
"""
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MARK = re.compile(r"^<!--\s*(runnable|options-checked|not-checked)\s*(?::\s*(.*?))?\s*-->\s*$")
FENCE = re.compile(r"^```(\S*)\s*$")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
REPO_DIRS = ("tests/", "bench/", "examples/", "scripts/", "common/", "fuzz/", "docs/")
# options of other programs that the pages quote (mpirun, valgrind, spm_train, Megatron-LM,
# perf, make, gcc): not ptrain's
FOREIGN = {"--allow-run-as-root", "--oversubscribe", "--bind-to", "--leak-check",
           "--model_type", "--reduce-bucket-size", "--no-print-directory", "--overlap-param-gather",
           "--option"}  # --option: testing.md's placeholder
README_MAX = 450

failures = []


def fail(where, msg):
    failures.append(f"{where}: {msg}")


def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def doc_files(args):
    if args:
        return [os.path.relpath(os.path.abspath(a), ROOT) for a in args]
    docs = sorted(os.path.join("docs", f) for f in os.listdir(os.path.join(ROOT, "docs"))
                  if f.endswith(".md"))
    return ["README.md"] + docs


def blocks(path):
    """(line, lang, marker, reason, text) of every fenced block."""
    lines = read(os.path.join(ROOT, path)).split("\n")
    out, i = [], 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        start, lang = i, m.group(1)
        j = i + 1
        while j < len(lines) and lines[j].strip() != "```":
            j += 1
        k = start - 1
        while k >= 0 and not lines[k].strip():
            k -= 1
        mk = MARK.match(lines[k].strip()) if k >= 0 else None
        out.append((start + 1, lang, mk.group(1) if mk else None,
                    (mk.group(2) or "") if mk else "", "\n".join(lines[start + 1:j])))
        i = j + 1
    return out


def prose(path):
    """The page without its fenced blocks (code spans stay)."""
    text, keep, inside = read(os.path.join(ROOT, path)).split("\n"), [], False
    for line in text:
        if FENCE.match(line) or (inside and line.strip() == "```"):
            inside = not inside
            keep.append("")
            continue
        keep.append("" if inside else line)
    return "\n".join(keep)


# ---- programs and their options ----------------------------------------------------

_help = {}


def program_source(name):
    base = re.sub(r"_(mpi|faults|asan|tsan|vg|noblas|dnnl)$", "", name)
    base = re.sub(r"_(mpi)$", "", base)
    cands = [f"examples/{base}.c", f"bench/{base}.c", f"tests/{base}.c"]
    if base == "tests":
        cands += ["tests/test_main.c", "tests/test.h"]
    return [c for c in cands if os.path.isfile(os.path.join(ROOT, c))]


def program_text(name):
    """What the program says it takes: --help's output and its source text."""
    if name in _help:
        return _help[name]
    text = ""
    exe = os.path.join(ROOT, "build", name)
    if os.access(exe, os.X_OK) and program_source(name) and name not in ("tests", "comm_check"):
        try:
            r = subprocess.run([exe, "--help"], capture_output=True, text=True, timeout=60,
                               cwd=ROOT)
            text += r.stdout + r.stderr
        except (OSError, subprocess.SubprocessError):
            pass
    for src in program_source(name) + [os.path.join("common", f) for f in
                                       os.listdir(os.path.join(ROOT, "common"))]:
        text += read(os.path.join(ROOT, src))
    _help[name] = text
    return text


def known_program(name):
    return bool(program_source(name)) or os.access(os.path.join(ROOT, "build", name), os.X_OK)


def option_known(name, opt):
    text = program_text(name)
    bare = opt[2:]
    return (re.search(r"(^|[\s\[])" + re.escape(opt) + r"(\s|=|$)", text, re.M) is not None or
            f'"{bare}"' in text or f'"{opt}"' in text)


def all_options():
    opts = set(FOREIGN)
    for d in ("examples", "bench", "tests", "common", "fuzz", "scripts"):
        for f in os.listdir(os.path.join(ROOT, d)):
            if f.endswith((".c", ".h", ".sh", ".py")):
                t = read(os.path.join(ROOT, d, f))
                opts.update("--" + o for o in re.findall(r'\{"([a-z0-9-]+)",\s*CLI_', t))
                opts.update(re.findall(r'"(--[a-z0-9-]+)"', t))
                opts.update(re.findall(r"(--[a-z][a-z0-9-]+)\)", t))  # sh case patterns
    return opts


def words(cmd):
    try:
        return shlex.split(cmd, comments=True)
    except ValueError:
        return cmd.split()


_made = {}


def make_dry_run(targets):
    """None when make knows how to make targets (make -n), else its last error line."""
    if targets not in _made:
        env = {k: v for k, v in os.environ.items()
               if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES")}
        r = subprocess.run(["make", "-n", "--no-print-directory"] + list(targets), cwd=ROOT,
                           capture_output=True, text=True, env=env, timeout=120)
        _made[targets] = None if r.returncode == 0 else \
            (r.stderr.strip().splitlines() or [""])[-1]
    return _made[targets]


def check_command(where, cmd):
    """The options of build/PROGRAM, make targets and repository paths in one command."""
    for part in re.split(r"&&|\|\||;|\|", cmd):
        w = words(part)
        for i, tok in enumerate(w):
            m = re.fullmatch(r"(?:\./)?build/([a-z0-9_]+)", tok)
            if m:
                name = m.group(1)
                if not known_program(name):
                    fail(where, f"build/{name}: no such program")
                    break
                for a in w[i + 1:]:
                    o = re.match(r"(--[a-zA-Z0-9][a-zA-Z0-9_-]*)", a)
                    if o and not option_known(name, o.group(1)):
                        fail(where, f"build/{name} has no option {o.group(1)}")
                break
            if tok == "make" and i == 0:
                targets = [a for a in w[1:] if not a.startswith("-") and "=" not in a]
                if any(re.search(r"[A-Z]{2,}", t) for t in targets):
                    break  # a placeholder (make build/NAME)
                err = make_dry_run(tuple(targets))
                if err is not None:
                    fail(where, f"make {' '.join(targets)}: make -n fails: {err}")
                break
        for tok in w:
            if tok.startswith("../shared") or "/shared/fixtures" in tok:
                fail(where, f"{tok}: a path into ../shared, which a clone does not have")
            elif (tok.startswith(REPO_DIRS) and not re.search(r"[*$?\[{<]", tok) and
                  not os.path.exists(os.path.join(ROOT, tok.rstrip(".,:;)")))):
                fail(where, f"{tok}: no such file in the repository")


def joined(text):
    """Commands of a block: continuation lines joined."""
    return text.replace("\\\n", " ").split("\n")


def check_static(files):
    opts = all_options()
    n_blocks = {"runnable": 0, "options-checked": 0, "not-checked": 0}
    for path in files:
        for line, lang, marker, reason, text in blocks(path):
            where = f"{path}:{line}"
            if lang in ("sh", "bash", "shell"):
                if marker is None:
                    fail(where, "a ```sh block without a marker (<!-- runnable -->, "
                         "<!-- options-checked: WHY --> or <!-- not-checked: WHY -->)")
                    continue
                n_blocks[marker] += 1
                if marker in ("options-checked", "not-checked") and not reason:
                    fail(where, f"<!-- {marker} --> without the reason")
                if marker == "not-checked":
                    continue
                for cmd in joined(text):
                    check_command(where, cmd)
            elif marker is not None:
                fail(where, f"<!-- {marker} --> before a ```{lang} block (only sh blocks run)")
        body = prose(path)
        for m in re.finditer(r"`([^`]+)`", body):
            span = " ".join(m.group(1).split())
            where = f"{path}:{body.count(chr(10), 0, m.start()) + 1}"
            if re.search(r"(^|\s)build/[a-z0-9_]+(\s|$)", span) or re.match(r"make( |$)", span):
                check_command(where, span)
            if "../shared" in span:
                fail(where, f"`{span}`: a path into ../shared, which a clone does not have")
            for o in re.findall(r"(?<![\w-])(--[a-z][a-z0-9_-]*[a-z0-9])", span):
                if o not in opts:
                    fail(where, f"`{span}`: no program takes {o}")
        check_links(path)
    if "README.md" in files:
        n = read(os.path.join(ROOT, "README.md")).count("\n")
        if n > README_MAX:
            fail("README.md", f"{n} lines, more than {README_MAX}")
        readme = read(os.path.join(ROOT, "README.md"))
        for f in os.listdir(os.path.join(ROOT, "docs")):
            if f.endswith(".md") and f"(docs/{f})" not in readme:
                fail("README.md", f"docs/{f} is not linked")
    return n_blocks


_slugs = {}


def slugs(path):
    if path not in _slugs:
        out = set()
        for line in prose(path).split("\n"):
            m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
            if m:
                s = m.group(1).strip().lower()
                s = re.sub(r"[^\w\- ]", "", s)
                out.add(s.replace(" ", "-"))
        _slugs[path] = out
    return _slugs[path]


def check_links(path):
    body = prose(path)
    for m in LINK.finditer(body):
        target = m.group(1)
        where = f"{path}:{body.count(chr(10), 0, m.start()) + 1}"
        if re.match(r"^[a-z]+:", target):
            continue
        file, _, anchor = target.partition("#")
        dest = os.path.normpath(os.path.join(os.path.dirname(path), file)) if file else path
        if dest.startswith(".."):
            fail(where, f"({target}) leaves the repository")
            continue
        if not os.path.exists(os.path.join(ROOT, dest)):
            fail(where, f"({target}): {dest} does not exist")
            continue
        if anchor and dest.endswith(".md") and anchor not in slugs(dest):
            fail(where, f"({target}): no heading #{anchor} in {dest}")


def run_blocks(files):
    """Each file's runnable blocks in order, in a fresh directory of its own."""
    ran = 0
    for path in files:
        todo = [(line, text) for line, lang, marker, _, text in blocks(path)
                if marker == "runnable" and lang in ("sh", "bash", "shell")]
        if not todo:
            continue
        with tempfile.TemporaryDirectory(prefix="ptrain-docs-") as tmp:
            os.mkdir(os.path.join(tmp, "build"))
            for f in os.listdir(os.path.join(ROOT, "build")):
                p = os.path.join(ROOT, "build", f)
                if os.path.isfile(p) and os.access(p, os.X_OK):
                    os.symlink(p, os.path.join(tmp, "build", f))
            for d in ("tests", "examples", "common", "bench", "scripts", "ptrain.h"):
                os.symlink(os.path.join(ROOT, d), os.path.join(tmp, d))
            for line, text in todo:
                ran += 1
                t0 = time.time()
                try:
                    r = subprocess.run(["sh", "-e", "-c", text], cwd=tmp, capture_output=True,
                                       text=True, timeout=900)
                    rc, out = r.returncode, r.stdout + r.stderr
                except subprocess.TimeoutExpired as e:
                    rc, out = "timeout", str(e.stdout or "") + str(e.stderr or "")
                status = "ok" if rc == 0 else "FAIL"
                print(f"  {status:4} {path}:{line} ({len(text.splitlines())} lines, "
                      f"{time.time() - t0:.1f} s)", flush=True)
                if rc != 0:
                    tail = "\n".join(out.strip().splitlines()[-25:])
                    fail(f"{path}:{line}", f"exit {rc}:\n{text}\n--- its output's end:\n{tail}")
    return ran


def main():
    args = sys.argv[1:]
    static = "--run" not in args
    run = "--static" not in args
    files = doc_files([a for a in args if not a.startswith("--")])
    if not os.access(os.path.join(ROOT, "build", "train"), os.X_OK):
        print("SKIP: build/train is not built (make builds the programs the pages use)")
        return 77
    if static:
        n = check_static(files)
        print(f"docs: {len(files)} pages; sh blocks: {n['runnable']} runnable, "
              f"{n['options-checked']} options-checked, {n['not-checked']} not checked")
    if run:
        print(f"docs: {run_blocks(files)} runnable blocks run")
    for f in failures:
        print("FAIL " + f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
