"""Harbor task directories (the shipped 40-task suite, or any) as the seed's Terminal-Bench 2 dataset.

The seed's ``terminalbench2_env.py`` reads its tasks with ``load_dataset(dataset_name,
split="train")`` from the Hugging Face hub (``NousResearch/terminal-bench-2``): rows of
``task_name``, ``category``, ``instruction``, ``docker_image``, ``environment_tar`` and
``tests_tar`` (base64 of a ``.tar.gz``) and ``test_sh``. Offline, that download fails. This
writes the same rows from local Harbor tasks into a directory ``load_dataset`` reads as a local
dataset (``train.jsonl``), so the seed's env runs unchanged on them::

    python -m trajforge.envs.hermes.tb2_data OUT_DIR [--tasks DIR] [--base-image IMAGE]
    trajforge env eval terminalbench2_env.py:TerminalBench2EvalEnv --config tb2.yaml --sandbox docker

with ``tb2.yaml`` setting ``dataset_name: OUT_DIR``. ``--base-image`` replaces each Dockerfile's
``FROM`` (an image the local docker engine has, where the task's own cannot be pulled).
Task files are read without following links (:class:`~trajforge.sandbox.confined.HostPath`).
"""

from __future__ import annotations

import argparse
import base64
import io
import re
import tarfile
from pathlib import Path
from typing import Any

import orjson

from trajforge.sandbox.confined import HostPath

_FROM = re.compile(r"^(\s*FROM\s+)(\S+)", re.IGNORECASE | re.MULTILINE)


def _tar_b64(files: dict[str, tuple[bytes, int]]) -> str:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for rel, (data, mode) in sorted(files.items()):
            info = tarfile.TarInfo(rel)
            info.size = len(data)
            info.mode = 0o755 if mode & 0o111 else 0o644
            tar.addfile(info, io.BytesIO(data))
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _tree(root: HostPath) -> dict[str, tuple[bytes, int]]:
    if root.kind() != "dir":
        return {}
    return {rel: (data, mode) for rel, data, mode in root.files(skip=("__pycache__",))}


def task_row(task: HostPath, base_image: str | None = None) -> dict[str, Any]:
    """One Harbor task directory as a row of the seed's TB2 dataset."""
    from trajforge.envs.library.harbor_task import HarborTaskConfig, strip_canary

    config = HarborTaskConfig.from_toml((task / "task.toml").read_text())
    environment = _tree(task / "environment")
    if base_image and "Dockerfile" in environment:
        text, mode = environment["Dockerfile"]
        environment["Dockerfile"] = (
            _FROM.sub(lambda m: m.group(1) + base_image, text.decode()).encode(),
            mode,
        )
    tests = _tree(task / "tests")
    test_sh = tests.get("test.sh", (b"", 0))[0].decode(errors="replace")
    return {
        "task_name": task.name,
        "category": config.category,
        "instruction": strip_canary((task / "instruction.md").read_text()),
        "docker_image": config.environment.docker_image or "",
        "environment_tar": _tar_b64(environment) if environment else "",
        "tests_tar": _tar_b64(tests) if tests else "",
        "test_sh": test_sh,
    }


def write_tb2_dataset(out_dir: Path, tasks_dir: Path | None = None, base_image: str | None = None) -> int:
    """Write ``out_dir/train.jsonl`` from the Harbor tasks of ``tasks_dir`` (default: the shipped
    suite); the number of tasks written."""
    from trajforge.envs.library.terminal_bench import shipped_dir

    root = HostPath.of(tasks_dir or shipped_dir())
    rows = [
        task_row(p, base_image)
        for p in sorted(root.iterdir(), key=lambda p: p.name)
        if p.kind() == "dir" and (p / "task.toml").kind() == "file"
    ]
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "train.jsonl").write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    return len(rows)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--tasks", type=Path, default=None, help="Harbor tasks (default: the shipped suite)")
    parser.add_argument("--base-image", default=None, help="replace each Dockerfile's FROM image")
    args = parser.parse_args(argv)
    n = write_tb2_dataset(args.out_dir, args.tasks, args.base_image)
    print(f"{n} tasks -> {args.out_dir / 'train.jsonl'} (dataset_name: {args.out_dir})")


if __name__ == "__main__":  # pragma: no cover - python -m trajforge.envs.hermes.tb2_data
    main()
