"""A small Dockerfile reader for the static checks of tests/unit/test_dockerfiles.py (no Docker needed).

Parses the instructions of a Dockerfile (continuation lines joined, comments dropped) into the global
ARGs before the first FROM and one Stage per FROM, and answers the questions those checks ask.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

# set by Docker or the base images, not by ARG/ENV in the file
PREDEFINED = {
    "PATH",
    "HOME",
    "HOSTNAME",
    "TARGETARCH",
    "TARGETPLATFORM",
    "BUILDPLATFORM",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "NO_PROXY",
}


@dataclass
class Instruction:
    line: int
    keyword: str
    args: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.keyword} {self.args}"


@dataclass
class Stage:
    name: str
    base: str
    line: int
    instructions: list[Instruction] = field(default_factory=list)

    def all(self, keyword: str) -> list[Instruction]:
        return [i for i in self.instructions if i.keyword == keyword]

    def declared(self) -> set[str]:
        """Names an ARG or ENV of this stage declares (ENV: KEY=VALUE pairs or `ENV KEY VALUE`)."""
        names = set()
        for inst in self.instructions:
            if inst.keyword == "ARG":
                names.add(inst.args.split("=", 1)[0].strip())
            elif inst.keyword == "ENV":
                words = shlex.split(inst.args)
                if words and "=" not in words[0]:
                    names.add(words[0])
                else:
                    names.update(w.split("=", 1)[0] for w in words if "=" in w)
        return names

    def user(self) -> str | None:
        users = self.all("USER")
        return users[-1].args.strip() if users else None

    def run_text(self) -> str:
        return "\n".join(i.args for i in self.all("RUN"))


@dataclass
class Dockerfile:
    path: Path
    directives: list[str]
    global_args: dict[str, str | None]
    stages: list[Stage]

    def stage(self, name: str) -> Stage:
        return next(s for s in self.stages if s.name == name)


def _logical_lines(text: str) -> list[tuple[int, str]]:
    lines, current, start = [], "", 0
    for number, raw in enumerate(text.splitlines(), 1):
        stripped = raw.strip()
        if not current and (not stripped or stripped.startswith("#")):
            continue
        if current and stripped.startswith("#"):  # a comment inside a continued instruction
            continue
        if not current:
            start = number
        if stripped.endswith("\\"):
            current += stripped[:-1] + " "
            continue
        lines.append((start, current + stripped))
        current = ""
    if current:
        lines.append((start, current))
    return lines


def parse(path: str | Path) -> Dockerfile:
    path = Path(path)
    text = path.read_text()
    directives = [m.group(0) for m in re.finditer(r"^#\s*(syntax|escape|check)\s*=.*$", text, re.M | re.I)]
    global_args: dict[str, str | None] = {}
    stages: list[Stage] = []
    for number, line in _logical_lines(text):
        keyword, _, args = line.partition(" ")
        keyword, args = keyword.upper(), args.strip()
        if keyword == "FROM":
            match = re.fullmatch(r"(?:--platform=\S+\s+)?(\S+)(?:\s+AS\s+(\S+))?", args, re.I)
            if not match:
                raise ValueError(f"{path.name}:{number}: cannot read FROM {args}")
            stages.append(Stage(match.group(2) or str(len(stages)), match.group(1), number))
        elif not stages:
            if keyword != "ARG":
                raise ValueError(f"{path.name}:{number}: {keyword} before the first FROM")
            name, eq, value = args.partition("=")
            global_args[name.strip()] = value if eq else None
        else:
            stages[-1].instructions.append(Instruction(number, keyword, args))
    return Dockerfile(path, directives, global_args, stages)


def variables(text: str) -> set[str]:
    """Upper-case ${NAME} / $NAME references (lower-case names are the RUN scripts' own shell variables)."""
    return {m.group(1) or m.group(2) for m in re.finditer(r"\$\{([A-Z][A-Z0-9_]*)[^}]*\}|\$([A-Z][A-Z0-9_]*)", text)}


def apt_packages(stage: Stage) -> set[str]:
    """The packages a stage's RUNs `apt-get install` (options dropped, ${VAR} prefixes kept as written)."""
    packages = set()
    for run in stage.all("RUN"):
        for command in re.split(r";|&&|\|\|", run.args):
            words = command.split()
            if "apt-get" in words and "install" in words:
                packages.update(w for w in words[words.index("install") + 1 :] if not w.startswith("-"))
    return packages


def python_imports(stage: Stage) -> list[list[str]]:
    """For each `python -c "..."` of the stage's RUNs, the modules its import statements name, in order."""
    found = []
    for run in stage.all("RUN"):
        for match in re.finditer(r"python3?(?:\.\d+)?\s+-c\s+(\"[^\"]*\"|'[^']*')", run.args):
            modules = []
            for statement in re.findall(r"(?:^|;)\s*import\s+([\w., ]+)", match.group(1)[1:-1]):
                modules += [m.strip().split(".")[0] for m in statement.split(",") if m.strip()]
            found.append(modules)
    return found
