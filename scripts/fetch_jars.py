#!/usr/bin/env python3
"""Resolve the JVM artifacts listed in deps/jvm-artifacts.txt from Maven Central into .deps/<set>/.

Each set is resolved with one generated pom and `mvn dependency:copy-dependencies` (jar sets) or
`mvn dependency:copy` + unpack (archive entries). A set is skipped when its stamp file matches the
coordinates that produced it, so re-running is cheap and a changed coordinate re-resolves only that set.

Uses only the standard library: it runs before the project's virtualenv exists.
"""
from __future__ import annotations

import argparse
import hashlib
import shutil
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LIST = ROOT / "deps" / "jvm-artifacts.txt"
OUT = ROOT / ".deps"
STAMP = ".resolved"


@dataclass(frozen=True)
class Artifact:
    group: str
    artifact: str
    version: str
    type: str
    classifier: str
    mode: str  # deps | nodeps | unpack
    exclude: tuple[str, ...]

    @property
    def coords(self) -> str:
        parts = [self.group, self.artifact, self.version, self.type]
        if self.classifier:
            parts.append(self.classifier)
        return ":".join(parts)


def parse(path: Path) -> dict[str, list[Artifact]]:
    """Read the coordinates list into {set: [Artifact]}; a malformed line stops with its line number."""
    sets: dict[str, list[Artifact]] = {}
    for lineno, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        fields = line.split()
        if len(fields) < 3:
            sys.exit(f"{path}:{lineno}: expected 'set coordinates mode [exclude=...]', got {raw!r}")
        name, coords, mode, *opts = fields
        parts = coords.split(":")
        if len(parts) not in (3, 4, 5) or mode not in ("deps", "nodeps", "unpack"):
            sys.exit(f"{path}:{lineno}: bad coordinates or mode in {raw!r}")
        exclude: tuple[str, ...] = ()
        for opt in opts:
            if not opt.startswith("exclude="):
                sys.exit(f"{path}:{lineno}: unknown option {opt!r}")
            exclude = tuple(opt.removeprefix("exclude=").split(","))
        group, art, version = parts[:3]
        typ = parts[3] if len(parts) > 3 else "jar"
        classifier = parts[4] if len(parts) > 4 else ""
        sets.setdefault(name, []).append(Artifact(group, art, version, typ, classifier, mode, exclude))
    return sets


def pom(artifacts: list[Artifact]) -> str:
    deps = []
    for a in artifacts:
        excl = "<exclusions><exclusion><groupId>*</groupId><artifactId>*</artifactId></exclusion></exclusions>"
        deps.append(
            f"<dependency><groupId>{a.group}</groupId><artifactId>{a.artifact}</artifactId>"
            f"<version>{a.version}</version>"
            + (f"<type>{a.type}</type>" if a.type != "jar" else "")
            + (f"<classifier>{a.classifier}</classifier>" if a.classifier else "")
            + (excl if a.mode == "nodeps" else "")
            + "</dependency>"
        )
    return (
        '<project xmlns="http://maven.apache.org/POM/4.0.0"><modelVersion>4.0.0</modelVersion>'
        "<groupId>local.cdc</groupId><artifactId>deps</artifactId><version>0</version>"
        f"<packaging>pom</packaging><dependencies>{''.join(deps)}</dependencies></project>"
    )


def mvn(args: list[str], cwd: Path) -> None:
    cmd = ["mvn", "-B", "-q", "-ntp", *args]
    result = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        sys.exit(f"mvn failed in {cwd}: {' '.join(cmd)}\n{result.stdout[-4000:]}\n{result.stderr[-4000:]}")


def resolve(name: str, artifacts: list[Artifact], force: bool) -> None:
    dest = OUT / name
    digest = hashlib.sha256("\n".join(repr(a) for a in artifacts).encode()).hexdigest()
    stamp = dest / STAMP
    if not force and stamp.exists() and stamp.read_text() == digest:
        print(f"[fetch_jars] {name}: up to date ({dest})")
        return
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    jars = [a for a in artifacts if a.mode != "unpack"]
    archives = [a for a in artifacts if a.mode == "unpack"]
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        if jars:
            (work / "pom.xml").write_text(pom(jars))
            exclude = sorted({g for a in jars for g in a.exclude})
            args = ["dependency:copy-dependencies", f"-DoutputDirectory={dest}", "-DincludeScope=runtime"]
            if exclude:
                args.append(f"-DexcludeGroupIds={','.join(exclude)}")
            mvn(args, work)
            # excludeGroupIds filters the set's listed artifacts too: copy those of an excluded group one by one.
            for a in jars:
                if a.group in exclude:
                    mvn(["dependency:copy", f"-Dartifact={a.coords}", f"-DoutputDirectory={dest}"], work)
        for a in archives:
            (work / "pom.xml").write_text(pom([]))
            mvn(["dependency:copy", f"-Dartifact={a.coords}", f"-DoutputDirectory={work}"], work)
            archive = next(work.glob(f"{a.artifact}-*.{a.type}"))
            with tarfile.open(archive) as tar:
                tar.extractall(dest, filter="data")
    stamp.write_text(digest)
    count = sum(1 for _ in dest.rglob("*.jar"))
    print(f"[fetch_jars] {name}: {count} jars in {dest}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("sets", nargs="*", help="sets to resolve (default: all)")
    parser.add_argument("--force", action="store_true", help="re-resolve even when the stamp matches")
    parser.add_argument("--list", action="store_true", help="print the sets and their coordinates, resolve nothing")
    args = parser.parse_args()
    sets = parse(LIST)
    if args.list:
        for name, arts in sets.items():
            for a in arts:
                print(f"{name:10s} {a.coords} {a.mode}")
        return
    unknown = set(args.sets) - set(sets)
    if unknown:
        sys.exit(f"unknown set(s) {sorted(unknown)}; known: {sorted(sets)}")
    for name in args.sets or list(sets):
        resolve(name, sets[name], args.force)


if __name__ == "__main__":
    main()
