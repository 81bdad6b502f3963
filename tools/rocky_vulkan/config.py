"""Load rocky-vulkan.yaml into frozen, typed objects, or fail naming the file, field and fix."""

from __future__ import annotations

import base64
import binascii
import functools
import json
import math
import os
import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import jsonschema
import yaml

from rocky_vulkan.errors import UserError
from rocky_vulkan.regularfile import NotReadable, read_regular, shown

PATCH_DIR_NAME = "patches"
REQUIRED_REPOS = ("bitbake", "openembedded-core", "meta-arm", "meta-rockchip")

# Limits checked while the YAML is composed, before any object is built: the config is a few
# kB and a few levels deep, so these only stop alias/depth bombs and runaway files.
MAX_CONFIG_BYTES = 1 << 20
MAX_DEPTH = 20
MAX_NODES = 20_000
# The longest number literal a config needs (its numbers have at most 7 digits): a longer one
# stays text (_LongNumber) and the schema refuses it naming the field. Converting it would
# fail (int() of over 4300 digits raises) or overflow (a 400-digit int is no float).
MAX_NUMBER_CHARS = 32

# Query and fragment parameters that carry a credential (tokens, passwords, signed URLs of S3,
# Google Cloud Storage and Azure).
SECRET_PARAMS = frozenset(
    """token access_token id_token auth auth_token private_token api_key apikey key password
    passwd pwd secret client_secret sig signature x-amz-signature x-amz-credential
    x-amz-security-token x-goog-signature x-goog-credential""".split()
)

# Accounts and groups an OE image already has (base-passwd, systemd, openssh, the self-test's
# rocky-selftest, ...): the image
# user must not be one of them (useradd would fail, or the user would be a system account).
SYSTEM_ACCOUNTS = frozenset(
    """root daemon bin sys sync games man lp mail news uucp proxy www-data backup list irc gnats
    nobody nogroup adm tty disk kmem dialout fax voice cdrom floppy tape sudo audio dip operator
    src shadow utmp video sasl plugdev staff users input kvm render sgx clock shutdown wheel
    netdev messagebus sshd avahi polkitd tss dbus systemd-journal""".split()
)


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
class VulkanCts:
    """dEQP-VK on the board: the upstream repo whose layer holds the vulkan-cts recipe, added
    only by the kas fragment kas/vulkan-cts.yml (never by base.yml)."""

    repo: Repo


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
class ExtraModel:
    """An entry of models:, a GGUF model besides the reference one; serve.model may pick it."""

    name: str
    url: str
    filename: str
    sha256: str | None
    license: str  # an SPDX id or a short name: the recipe's LICENSE
    license_flags: str  # one OE LICENSE_FLAGS word, or "" (no acceptance needed)
    homepage: str


# serve.model's value for the model: section (the self-test's reference model).
REFERENCE_MODEL = "reference"


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
    kld_max_mean: float
    kld_min_same_top_p: float
    run_timeout_s: int
    deadline_s: int
    reference: Reference
    # `rocky-selftest tune`: seconds of llama-bench time in all, and whether the first boot tunes
    tune_budget_s: int = 1200
    tune_at_first_boot: bool = False


@dataclass(frozen=True)
class Serve:
    listen: str  # lan | localhost | off
    port: int
    model: str  # "reference" or a models: name
    request_prompt_tokens: int
    request_generated_tokens: int
    context_tokens: int
    parallel: int
    # A models: entry the self-test measures as the served model's draft (speculative decoding).
    draft_model: str | None = None


@dataclass(frozen=True)
class Image:
    user: str
    ssh_authorized_keys: tuple[str, ...]
    extra_packages: tuple[str, ...]
    # A crypt(3) hash ($y$ or $6$) or None: then there is no password until the first login
    # on the console, and SSH takes keys only.
    password_hash: str | None = None


@dataclass(frozen=True)
class Config:
    path: Path
    default_machine: str
    project_url: str
    release: str
    distro: str
    repos: tuple[Repo, ...]
    machines: tuple[Machine, ...]
    kernel_recipe: str
    mesa: Mesa
    llama_cpp: LlamaCpp
    model: Model
    selftest: Selftest
    serve: Serve
    image: Image
    models: tuple[ExtraModel, ...] = ()
    vulkan_cts: VulkanCts | None = None
    # Several boards serving one model (rocky_selftest/cluster.py checks and reads it); None:
    # one board.
    cluster: dict[str, Any] | None = None

    @property
    def root(self) -> Path:
        """The project folder: the folder the config's path names (for a config that is a
        symlink, the link's folder, not its target's). Render writes only here, and our
        patches are read from here."""
        return self.path.parent

    def patch_paths(self, names: tuple[str, ...]) -> list[Path]:
        """Our patches (e.g. `cfg.llama_cpp.patches`) as files under the project's patches/."""
        return [self.root / PATCH_DIR_NAME / name for name in names]

    @property
    def served_model(self) -> ExtraModel | None:
        """The models: entry serve.model names, or None when it is the reference model."""
        for model in self.models:
            if model.name == self.serve.model:
                return model
        return None

    @property
    def draft(self) -> ExtraModel | None:
        """The models: entry serve.draft_model names, or None."""
        return next((m for m in self.models if m.name == self.serve.draft_model), None)

    @property
    def served_filename(self) -> str:
        """The file name (in the board's model folder) of the model the server loads."""
        served = self.served_model
        return served.filename if served else self.model.filename

    def machine(self, name: str) -> Machine:
        for machine in self.machines:
            if machine.name == name:
                return machine
        known = ", ".join(m.name for m in self.machines)
        raise ConfigError(f"unknown machine {name!r}; machines in {self.path.name}: {known}")


# libyaml's parser when PyYAML has it (much faster), else the pure-Python one.
_BaseLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _check_events(text: str) -> None:
    """Refuse what a config never needs while only the event stream is read, before any node
    or object is built: anchors and aliases (alias bombs), nesting deeper than MAX_DEPTH
    (RecursionError in the composer) and more than MAX_NODES values."""
    depth = nodes = 0
    for event in yaml.parse(text, Loader=_BaseLoader):
        line = event.start_mark.line + 1
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None):
            raise ConfigError(
                f"line {line}: YAML anchors and aliases (&name, *name) are not allowed; "
                "write each value out in full"
            )
        if isinstance(event, yaml.ScalarEvent | yaml.CollectionStartEvent):
            nodes += 1
            if nodes > MAX_NODES:
                raise ConfigError(f"line {line}: more than {MAX_NODES} values; this is no config")
        if isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            if depth > MAX_DEPTH:
                raise ConfigError(
                    f"line {line}: nested more than {MAX_DEPTH} levels deep; "
                    "the config is only a few levels deep"
                )
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1


class _LongNumber:
    """A number literal longer than MAX_NUMBER_CHARS, not converted: no schema type matches it,
    so validation refuses it naming the field."""

    def __init__(self, text: str) -> None:
        self.chars = len(text)

    def __repr__(self) -> str:
        return f"a number of {self.chars} characters"


class _UniqueKeyLoader(_BaseLoader):  # type: ignore[misc, valid-type]
    """A safe loader that refuses duplicate keys instead of silently keeping the last one, and
    keys that are not plain scalars, and leaves over-long numbers unconverted (_LongNumber).
    Run _check_events on the text first."""

    def construct_number(self, node: yaml.ScalarNode) -> Any:
        if len(node.value) > MAX_NUMBER_CHARS:
            return _LongNumber(node.value)
        if node.tag.endswith(":int"):
            return self.construct_yaml_int(node)
        return self.construct_yaml_float(node)

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen = set()
        for key_node, _ in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                mark = key_node.start_mark
                raise ConfigError(f"line {mark.line + 1}: a key must be a plain name")
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                mark = key_node.start_mark
                raise ConfigError(
                    f"line {mark.line + 1}: duplicate key {key!r}; keep one of the two entries"
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


for _tag in ("tag:yaml.org,2002:int", "tag:yaml.org,2002:float"):
    _UniqueKeyLoader.add_constructor(_tag, _UniqueKeyLoader.construct_number)


def parse_yaml(text: str) -> Any:
    """The data in a config's text, with the limits and duplicate-key check of a config load
    (ConfigError without the file name, or yaml.YAMLError)."""
    _check_events(text)
    return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass


def _is_integer(checker: Any, instance: Any) -> bool:
    """An int written as an int: not 64.0 (which would render as '64.0'), not true/false."""
    return isinstance(instance, int) and not isinstance(instance, bool)


def _is_number(checker: Any, instance: Any) -> bool:
    """A finite int or float (no .nan/.inf: they cannot be written as JSON), not a bool."""
    if isinstance(instance, bool) or not isinstance(instance, int | float):
        return False
    return isinstance(instance, int) or math.isfinite(instance)  # (no float() of a big int)


def _fullmatch_pattern(validator: Any, pattern: str, instance: Any, schema: Any) -> Any:
    """JSON-schema `pattern` searches, and `$` matches before a trailing newline: here the
    whole string must match (re.fullmatch), so 'abc\\n' never passes '^abc$'."""
    if isinstance(instance, str) and not re.fullmatch(pattern, instance):
        yield jsonschema.ValidationError(f"{_short(instance)} does not match {pattern!r}")


def _short(value: Any, limit: int = 60) -> str:
    """repr() cut to `limit` characters, so a 1 MB value does not flood the message."""
    text = repr(value)
    if len(text) <= limit:
        return text
    size = f" ({len(value)} chars)" if isinstance(value, str) else ""
    return text[: limit - 5] + "...'" + size


_CHECKER = jsonschema.Draft202012Validator.TYPE_CHECKER.redefine_many(
    {"integer": _is_integer, "number": _is_number}
)
_Validator = jsonschema.validators.extend(
    jsonschema.Draft202012Validator,
    validators={"pattern": _fullmatch_pattern},
    type_checker=_CHECKER,
)


@functools.lru_cache(maxsize=1)
def _validator() -> Any:
    return _Validator(_schema())


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
    return f"{where}: expected {expected}, got {_short(error.instance)}"


def _validate(data: Any, source: Path) -> None:
    validator = _validator()
    errors = sorted(validator.iter_errors(data), key=lambda e: list(map(str, e.absolute_path)))
    if errors:
        lines = "\n  ".join(_describe(_leaf(e)) for e in errors)
        raise ConfigError(f"{shown(source)}: invalid config:\n  {lines}")


def _leaf(error: jsonschema.ValidationError) -> jsonschema.ValidationError:
    """For `$ref`/`oneOf` errors, keep the schema that says what is expected."""
    if error.schema.get("expected") or not error.context:
        return error
    best = jsonschema.exceptions.best_match(error.context)
    if best.schema.get("expected"):
        return best
    return error


def _non_finite(value: Any, path: tuple = ()) -> list[str]:
    """Fields holding YAML's .nan/.inf: JSON Schema's bounds let them through (NaN compares
    false with everything), and the board cannot compare a measurement with them."""
    if isinstance(value, float) and not math.isfinite(value):
        return [_field_path(path)]
    if isinstance(value, dict):
        return [f for k, v in value.items() for f in _non_finite(v, (*path, k))]
    if isinstance(value, list):
        return [f for i, v in enumerate(value) for f in _non_finite(v, (*path, i))]
    return []


def _check_finite(data: dict[str, Any], source: Path) -> None:
    bad = _non_finite(data)
    if bad:
        lines = "\n  ".join(f"{field}: expected a finite number, not .nan or .inf" for field in bad)
        raise ConfigError(f"{shown(source)}: invalid config:\n  {lines}")


def url_secret(text: str) -> str | None:
    """What in the URL `text` is a credential (a user name or password, a token or signature
    parameter), or None; None for text that is no URL."""
    if not re.match(r"[A-Za-z][A-Za-z0-9+.-]*://", text):
        return None
    try:
        parts = urlsplit(text)
    except ValueError:
        return None  # not a URL the schema lets through
    if "@" in parts.netloc:
        return "a user name or password (user:password@host)"
    for params in (parts.query, parts.fragment):
        for name, _ in parse_qsl(params, keep_blank_values=True):
            if name.lower() in SECRET_PARAMS:
                return f"a credential parameter ({name}=)"
    return None


def _secrets(value: Any, path: tuple = ()) -> list[str]:
    """'field: what' for each string of the data that is a URL with a credential."""
    if isinstance(value, str):
        what = url_secret(value)
        return [f"{_field_path(path)}: the URL holds {what}"] if what else []
    if isinstance(value, dict):
        return [f for k, v in value.items() for f in _secrets(v, (*path, k))]
    if isinstance(value, list):
        return [f for i, v in enumerate(value) for f in _secrets(v, (*path, i))]
    return []


def _check_secrets(data: Any, source: Path) -> None:
    """Before the schema (whose messages show values): a credential in a URL is refused without
    showing it; the config is committed and its URLs are copied into the layer."""
    bad = _secrets(data)
    if bad:
        raise ConfigError(
            f"{shown(source)}: invalid config:\n  "
            + "\n  ".join(bad)
            + "\n  Credentials never go in rocky-vulkan.yaml (it is committed, and its URLs are "
            "copied into the layer): write the plain URL and put the login in ~/.netrc on the "
            "machine that downloads, or use a git credential helper"
        )


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
    problems += _vulkan_cts_problems(data, names)
    for name in REQUIRED_REPOS:
        if name not in names:
            problems.append(
                f"repos: {name!r} is missing (no repos[].name is {name!r}); the layer depends on it"
            )
    user = data["image"]["user"]
    if user in SYSTEM_ACCOUNTS or user.startswith(("systemd-", "rocky-selftest")):
        problems.append(
            f"image.user: {user!r} is root or a system account/group of the image; "
            "pick a personal login name like rocky"
        )
    for i, key in enumerate(data["image"]["ssh_authorized_keys"]):
        problem = _ssh_key_problem(key)
        if problem:
            problems.append(f"image.ssh_authorized_keys[{i}]: {problem}")
    problems += _model_problems(data)
    problems += _cluster_problems(data.get("cluster"))
    # Here, not at the top: the layer package (render's outputs) imports this module.
    from rocky_vulkan.layer import reserved

    problems += reserved.problems(data)
    patch_dir = source.parent / PATCH_DIR_NAME
    for section in ("mesa", "llama_cpp"):
        for i, patch in enumerate(data[section]["patches"]):
            path = patch_dir / patch
            if not path.is_file():
                problems.append(
                    f"{section}.patches[{i}]: {patch!r} is "
                    + ("not a regular file" if os.path.lexists(path) else "not")
                    + f" in {shown(patch_dir)}; add the file or drop the entry"
                )
    if problems:
        raise ConfigError(f"{shown(source)}: invalid config:\n  " + "\n  ".join(problems))


def _vulkan_cts_problems(data: dict[str, Any], base_names: list[str]) -> list[str]:
    """vulkan_cts.repo: a layer to add, and a name of its own (kas would merge two entries of
    one name, so the fragment would change a repo of base.yml)."""
    repo = data["vulkan_cts"]["repo"]
    problems = []
    if repo["name"] in base_names:
        problems.append(
            f"vulkan_cts.repo.name: {repo['name']!r} is also a repos[].name; the fragment's "
            "repo needs a name of its own (e.g. meta-openembedded)"
        )
    if not repo["layers"]:
        problems.append(
            "vulkan_cts.repo.layers: empty; name the layer that holds the vulkan-cts recipe "
            "(meta-oe)"
        )
    return problems


def _model_problems(data: dict[str, Any]) -> list[str]:
    """models: names unique and not `reference`, one file each (they share one folder on the
    board), and serve.model naming one of them or the reference model."""
    problems = []
    models = data.get("models", [])
    names = [m["name"] for m in models]
    files = {data["model"]["filename"]: "model.filename"}
    for i, model in enumerate(models):
        where = f"models[{i}]"
        if model["name"] == REFERENCE_MODEL:
            problems.append(
                f"{where}.name: {REFERENCE_MODEL!r} is the model: section's name in serve.model; "
                "pick another name"
            )
        elif names.index(model["name"]) != i:
            problems.append(
                f"{where}.name: {model['name']!r} is also models[{names.index(model['name'])}]"
                "'s name; give each model its own name"
            )
        if model["filename"] in files:
            problems.append(
                f"{where}.filename: {model['filename']!r} is also {files[model['filename']]}; "
                "the models share one folder on the board, so give each its own file name"
            )
        files.setdefault(model["filename"], f"{where}.filename")
    served = data["serve"]["model"]
    if served != REFERENCE_MODEL and served not in names:
        others = f" or a models[].name ({', '.join(names)})" if names else ""
        problems.append(
            f"serve.model: {served!r} is not a model of this config; use {REFERENCE_MODEL} "
            f"(the model: section){others}, or add an entry named {served!r} under models:"
        )
    return problems + _draft_problems(data, models, served)


def _cluster_problems(cluster: dict[str, Any] | None) -> list[str]:
    """What the schema cannot say of cluster: (a private subnet that holds every board, no
    board twice); the board reads it with the same rules."""
    from rocky_selftest.cluster import problem

    why = problem(cluster) if cluster else None
    return [f"cluster: must be {why}; see docs/user/cluster.md"] if why else []


def _draft_problems(data: dict[str, Any], models: list[dict], served: str) -> list[str]:
    """serve.draft_model: a models: entry other than the served one, whose licence asks for no
    acceptance (the image installs it; one LICENSE_FLAGS check, the served model's, is enough)."""
    draft = data["serve"].get("draft_model")
    if draft is None:
        return []
    entry = next((m for m in models if m["name"] == draft), None)
    if entry is None:
        return [
            f"serve.draft_model: {draft!r} is not an entry of models:; add the draft model "
            "(e.g. Qwen2.5-0.5B-Instruct for the Qwen2.5 reference) under models:, or set null"
        ]
    if draft == served:
        return [f"serve.draft_model: {draft!r} is the served model itself; name a smaller one"]
    if entry.get("license_flags"):
        return [
            f"serve.draft_model: {draft!r} has license_flags {entry['license_flags']!r}; a draft "
            "model must have a licence that asks for no acceptance (license_flags: '')"
        ]
    return []


# How many length-prefixed fields each key type's blob holds (RFC 4253, 5656, 8709; PROTOCOL.u2f).
_SSH_KEY_FIELDS = {
    "ssh-ed25519": 2,
    "ssh-rsa": 3,
    "ecdsa-sha2-nistp256": 3,
    "ecdsa-sha2-nistp384": 3,
    "ecdsa-sha2-nistp521": 3,
    "sk-ssh-ed25519@openssh.com": 3,
    "sk-ecdsa-sha2-nistp256@openssh.com": 4,
}


def ssh_authorized_key_problem(line: str) -> str | None:
    """Why `line` cannot go into image.ssh_authorized_keys, or None: the schema's exact pattern
    for that field, then the key data itself (the same checks as a config load)."""
    item = _schema()["properties"]["image"]["properties"]["ssh_authorized_keys"]["items"]
    if next(_Validator(item).iter_errors(line), None) is not None:
        return f"expected {item['expected']}"
    return _ssh_key_problem(line)


def _ssh_key_problem(line: str) -> str | None:
    """The key's base64 must decode to the blob ssh-keygen writes for that type: the type name,
    then exactly the fields of that key type. Catches keys cut short or with a wrong prefix."""
    kind, blob = line.split(" ")[:2]
    try:
        raw = base64.b64decode(blob, validate=True)
    except (binascii.Error, ValueError):
        return "the key's base64 part does not decode; paste the whole line of your .pub file"
    fields, pos = [], 0
    while pos + 4 <= len(raw):
        size = int.from_bytes(raw[pos : pos + 4], "big")
        fields.append(raw[pos + 4 : pos + 4 + size])
        pos += 4 + size
    if not fields or fields[0] != kind.encode():
        return f"the key data is not a {kind} key; paste the whole line of your .pub file"
    if pos != len(raw) or len(fields) != _SSH_KEY_FIELDS.get(kind):
        return "the key data is cut short or damaged; paste the whole line of your .pub file"
    return None


def _build(data: dict[str, Any], source: Path) -> Config:
    st = data["selftest"]
    return Config(
        path=source,
        default_machine=data["default_machine"],
        project_url=data["project"]["url"],
        release=data["yocto"]["release"],
        distro=data["yocto"]["distro"],
        repos=tuple(_repo(r) for r in data["repos"]),
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
            kld_max_mean=float(st["kld_max_mean"]),
            kld_min_same_top_p=float(st["kld_min_same_top_p"]),
            run_timeout_s=st["run_timeout_s"],
            deadline_s=st["deadline_s"],
            reference=Reference(**{k: float(v) for k, v in st["reference"].items()}),
            tune_budget_s=st["tune_budget_s"],
            tune_at_first_boot=st["tune_at_first_boot"],
        ),
        serve=Serve(**data["serve"]),
        image=Image(
            user=data["image"]["user"],
            ssh_authorized_keys=tuple(data["image"]["ssh_authorized_keys"]),
            extra_packages=tuple(data["image"]["extra_packages"]),
            password_hash=data["image"].get("password_hash"),
        ),
        models=tuple(ExtraModel(**m) for m in data.get("models", [])),
        vulkan_cts=VulkanCts(_repo(data["vulkan_cts"]["repo"])),
        cluster=data.get("cluster"),
    )


def _repo(r: dict[str, Any]) -> Repo:
    return Repo(r["name"], r["url"], r["branch"], r["commit"], tuple(r["layers"]))


def load_config(path: str | Path) -> Config:
    """Read, validate and freeze the config at `path`; raise ConfigError naming what is wrong.

    The path is made absolute but not resolved: the project is the folder it names (Config.root),
    also when the config file is a symlink to another project's."""
    source = Path(path).absolute()
    where = shown(source)
    try:
        raw = read_regular(source, MAX_CONFIG_BYTES, "config")
    except NotReadable as err:
        if err.why == "missing":
            raise ConfigError(
                f"{where}: config file not found; run from the project root or pass --config PATH"
            ) from None
        raise ConfigError(str(err)) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ConfigError(
            f"{where}: cannot read config: not UTF-8 text ({err.reason} at byte {err.start})"
        ) from None
    try:
        data = parse_yaml(text)
    except ConfigError as err:
        raise ConfigError(f"{where}: {err}") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"{where}: not valid YAML: {err}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a mapping of settings at the top level")
    _check_secrets(data, source)
    _validate(data, source)
    _check_finite(data, source)
    _check_references(data, source)
    return _build(data, source)
