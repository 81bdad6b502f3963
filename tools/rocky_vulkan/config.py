"""Load rocky-vulkan.yaml into frozen, typed objects, or fail naming the file, field and fix."""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from .errors import UserError

PATCH_DIR_NAME = "patches"
REQUIRED_REPOS = ("bitbake", "openembedded-core", "meta-arm", "meta-rockchip")


class ConfigError(UserError):
    """The config file is malformed; the message names file, field path and what is expected."""


@dataclass(frozen=True)
class Repo:
    name: str
    url: str
    branch: str
    commit: str
    layers: tuple[str, ...]


@dataclass(frozen=True)
class Machine:
    name: str
    description: str
    hostname: str
    soc: str
    devicetree: str
    uboot_defconfig: str
    serial_console: str
    serial_baud: int
    firmware: tuple[str, ...]


@dataclass(frozen=True)
class Mesa:
    version: str
    sha256: str
    patches: tuple[str, ...]


@dataclass(frozen=True)
class LlamaCpp:
    url: str
    branch: str
    srcrev: str
    build_number: int
    patches: tuple[str, ...]


@dataclass(frozen=True)
class Model:
    name: str
    url: str
    filename: str
    sha256: str | None


@dataclass(frozen=True)
class Reference:
    stock_tps: float
    tuned_tps: float
    cpu_tps: float


@dataclass(frozen=True)
class Selftest:
    ubatch_sizes: tuple[int, ...]
    prompt_tokens: int
    repetitions: int
    tuned_vs_stock_ratio: float
    ratio_tolerance: float
    match_tokens: int
    run_timeout_s: int
    deadline_s: int
    reference: Reference


@dataclass(frozen=True)
class Image:
    user: str
    ssh_authorized_keys: tuple[str, ...]
    extra_packages: tuple[str, ...]


@dataclass(frozen=True)
class Config:
    path: Path
    default_machine: str
    release: str
    distro: str
    repos: tuple[Repo, ...]
    machines: tuple[Machine, ...]
    kernel_recipe: str
    mesa: Mesa
    llama_cpp: LlamaCpp
    model: Model
    selftest: Selftest
    image: Image

    @property
    def root(self) -> Path:
        """The project root: the folder holding the config file."""
        return self.path.parent

    def machine(self, name: str) -> Machine:
        for machine in self.machines:
            if machine.name == name:
                return machine
        known = ", ".join(m.name for m in self.machines)
        raise ConfigError(f"unknown machine {name!r}; machines in {self.path.name}: {known}")


class _UniqueKeyLoader(yaml.SafeLoader):
    """A SafeLoader that refuses duplicate keys instead of silently keeping the last one."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                mark = key_node.start_mark
                raise ConfigError(
                    f"line {mark.line + 1}: duplicate key {key!r}; keep one of the two entries"
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _schema() -> dict[str, Any]:
    text = resources.files("rocky_vulkan").joinpath("schema/config.schema.json").read_text()
    return json.loads(text)


def _field_path(path: Any) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


def _describe(error: jsonschema.ValidationError) -> str:
    """Turn a schema error into 'field: expected X, got Y'."""
    where = _field_path(error.absolute_path)
    if error.validator == "additionalProperties":
        allowed = ", ".join(sorted(error.schema.get("properties", {}))) or "none"
        return f"{where}: {error.message}; allowed keys here: {allowed}"
    if error.validator == "required":
        return f"{where}: {error.message}"
    expected = error.schema.get("expected")
    if expected is None and "$ref" in error.schema:
        expected = None
    if expected is None:
        return f"{where}: {error.message}"
    return f"{where}: expected {expected}, got {error.instance!r}"


def _validate(data: Any, source: Path) -> None:
    validator = jsonschema.Draft202012Validator(_schema())
    errors = sorted(validator.iter_errors(data), key=lambda e: list(map(str, e.absolute_path)))
    if errors:
        lines = "\n  ".join(_describe(_leaf(e)) for e in errors)
        raise ConfigError(f"{source}: invalid config:\n  {lines}")


def _leaf(error: jsonschema.ValidationError) -> jsonschema.ValidationError:
    """For `$ref`/`oneOf` errors, keep the schema that says what is expected."""
    if error.schema.get("expected") or not error.context:
        return error
    best = jsonschema.exceptions.best_match(error.context)
    if best.schema.get("expected"):
        return best
    return error


def _check_references(data: dict[str, Any], source: Path) -> None:
    """Checks a schema cannot express: names that must refer to something that exists."""
    problems = []
    if data["default_machine"] not in data["machines"]:
        known = ", ".join(sorted(data["machines"]))
        problems.append(
            f"default_machine: unknown machine {data['default_machine']!r}; "
            f"define it under machines or use one of: {known}"
        )
    names = [repo["name"] for repo in data["repos"]]
    for name in sorted({n for n in names if names.count(n) > 1}):
        problems.append(f"repos: {name!r} is listed twice; keep one entry")
    for name in REQUIRED_REPOS:
        if name not in names:
            problems.append(f"repos: {name!r} is missing; the layer depends on it")
    patch_dir = source.parent / PATCH_DIR_NAME
    for section in ("mesa", "llama_cpp"):
        for i, patch in enumerate(data[section]["patches"]):
            if not (patch_dir / patch).is_file():
                problems.append(
                    f"{section}.patches[{i}]: {patch!r} is not in {patch_dir}; "
                    "add the file or drop the entry"
                )
    if problems:
        raise ConfigError(f"{source}: invalid config:\n  " + "\n  ".join(problems))


def _build(data: dict[str, Any], source: Path) -> Config:
    st = data["selftest"]
    return Config(
        path=source,
        default_machine=data["default_machine"],
        release=data["yocto"]["release"],
        distro=data["yocto"]["distro"],
        repos=tuple(
            Repo(r["name"], r["url"], r["branch"], r["commit"], tuple(r["layers"]))
            for r in data["repos"]
        ),
        machines=tuple(
            Machine(name=name, **{**m, "firmware": tuple(m["firmware"])})
            for name, m in sorted(data["machines"].items())
        ),
        kernel_recipe=data["kernel"]["recipe"],
        mesa=Mesa(data["mesa"]["version"], data["mesa"]["sha256"], tuple(data["mesa"]["patches"])),
        llama_cpp=LlamaCpp(**{**data["llama_cpp"], "patches": tuple(data["llama_cpp"]["patches"])}),
        model=Model(**data["model"]),
        selftest=Selftest(
            ubatch_sizes=tuple(st["ubatch_sizes"]),
            prompt_tokens=st["prompt_tokens"],
            repetitions=st["repetitions"],
            tuned_vs_stock_ratio=float(st["tuned_vs_stock_ratio"]),
            ratio_tolerance=float(st["ratio_tolerance"]),
            match_tokens=st["match_tokens"],
            run_timeout_s=st["run_timeout_s"],
            deadline_s=st["deadline_s"],
            reference=Reference(**{k: float(v) for k, v in st["reference"].items()}),
        ),
        image=Image(
            user=data["image"]["user"],
            ssh_authorized_keys=tuple(data["image"]["ssh_authorized_keys"]),
            extra_packages=tuple(data["image"]["extra_packages"]),
        ),
    )


def load_config(path: str | Path) -> Config:
    """Read, validate and freeze the config at `path`; raise ConfigError naming what is wrong."""
    source = Path(path).resolve()
    try:
        text = source.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(
            f"{source}: config file not found; run from the project root or pass --config PATH"
        ) from None
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"{source}: cannot read config: {err}") from None
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
    except ConfigError as err:
        raise ConfigError(f"{source}: {err}") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"{source}: not valid YAML: {err}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping of settings at the top level")
    _validate(data, source)
    _check_references(data, source)
    return _build(data, source)
