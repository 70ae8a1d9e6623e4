"""The one writer of edgectl's systemd units: a plan (edgectl.plan/1) in, unit text out.

The unit is built from the plan only, never from command-line arguments, by filling
``units/edgectl.service.in``. Everything taken from the plan is quoted for systemd here, and
what a unit cannot carry (a privileged port, a path the sandbox hides) is refused, so a
hand-edited plan cannot smuggle a line into the unit. Pure: no I/O except reading the
template, no systemd needed (tests compare the text with golden files).
"""

from __future__ import annotations

import ipaddress
import math
import posixpath
import re
from collections.abc import Mapping
from datetime import timedelta

from edgectl import launch
from edgectl.contract import environment, worker
from edgectl.contract.plan import Plan
from edgectl.errors import EdgectlError
from edgectl.paths import units_dir
from edgectl.probe.formats import format_cpu_list

TEMPLATE = "edgectl.service.in"

# A deployment name becomes the unit edgectl-NAME.service, the dynamic user edgectl-NAME
# (user names: at most 31 characters, so NAME at most 23), /etc/edgectl/NAME and
# /var/lib/edgectl/NAME. Names that collide with edgectl's own directories are refused.
NAME_MAX_CHARS = 31 - len("edgectl-")
_NAME_RE = re.compile(r"[a-z0-9](?:[a-z0-9_-]*[a-z0-9])?")
RESERVED_NAMES = frozenset({"models", "profiles"})  # /var/lib/edgectl/models, /etc/edgectl/profiles

# Back-off and start limit (systemd 252 has no growing back-off; see the template). The back-off
# is part of every recovery a user waits for (docs/facts.md, "A hung service, end to end"):
# short, with StartLimitBurst= ending a loop of failing starts.
RESTART_S = 2
# After the watchdog's SIGABRT, SIGKILL follows this soon (units/README.md, TimeoutAbortSec=).
ABORT_S = 5
START_LIMIT_BURST = 5

# Where the unit's sandbox hides things: ProtectHome=yes and PrivateTmp=yes.
HIDDEN_PREFIXES = ("/home", "/root", "/run/user", "/tmp", "/var/tmp")

# The service runs without CAP_NET_BIND_SERVICE, so it cannot bind a port below this.
FIRST_UNPRIVILEGED_PORT = 1024


def validate_name(name: str) -> str:
    """``name`` if it can name a deployment; else an EdgectlError saying what a name may be."""
    if not isinstance(name, str) or not name:
        raise EdgectlError("the deployment name is empty: pass --name NAME (e.g. --name smollm2)")
    rule = (f"use 1-{NAME_MAX_CHARS} lowercase letters, digits, '-' or '_', starting and ending "
            "with a letter or digit")
    if len(name) > NAME_MAX_CHARS:
        raise EdgectlError(f"deployment name {name!r} is {len(name)} characters long: {rule} "
                           f"(the service's user edgectl-NAME may have at most 31)")
    if not _NAME_RE.fullmatch(name):
        raise EdgectlError(f"invalid deployment name {name!r}: {rule}, e.g. --name smollm2")
    if name in RESERVED_NAMES:
        raise EdgectlError(f"deployment name {name!r} is reserved (edgectl keeps its {name} there): "
                           "pick another --name")
    return name


def unit_name(name: str) -> str:
    """The systemd unit of deployment ``name``: ``edgectl-NAME.service``."""
    return f"{worker.UNIT_PREFIX}{validate_name(name)}.service"


def state_dir(name: str) -> str:
    """The service's writable state directory (HOME), from ``StateDirectory=edgectl/NAME``."""
    return f"/var/lib/edgectl/{validate_name(name)}"


def cache_dir(name: str) -> str:
    """The service's cache directory (vLLM, torch inductor), from ``CacheDirectory=edgectl/NAME``."""
    return f"/var/cache/edgectl/{validate_name(name)}"


def unit_environment(name: str) -> dict[str, str]:
    """The variables the unit sets itself, after the plan's (the template's fixed lines).

    A plan may repeat one only with the same value: the state and cache paths belong to the unit.
    """
    state, cache = state_dir(name), cache_dir(name)
    return {
        "HOME": state,
        "XDG_CACHE_HOME": cache,
        "VLLM_CACHE_ROOT": f"{cache}/vllm",
        "TORCHINDUCTOR_CACHE_DIR": f"{cache}/torchinductor",
        "TRITON_CACHE_DIR": f"{cache}/triton",
        "PYTHONUNBUFFERED": "1",
        "HF_HUB_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
    }


# --- quoting for systemd -------------------------------------------------------------------
#
# systemd reads a setting's value by expanding %-specifiers, then splitting it into words with
# "..." quoting and C escapes (systemd.syntax(7), systemd.unit(7) "Specifiers"); ExecStart=
# also expands $VAR and ${VAR} in each word (systemd.service(7) "Command lines"). So every value
# taken from the plan is written as one double-quoted word in which \ " and control characters
# are C-escaped and % is doubled; in ExecStart= $ is doubled too. Words made only of safe
# characters are written bare, which keeps the common unit readable.

_SAFE_WORD_RE = re.compile(r"[A-Za-z0-9_@+=:,./-]+")


def _c_escape(text: str) -> str:
    out = []
    for ch in text:
        if ch == "\\":
            out.append("\\\\")
        elif ch == '"':
            out.append('\\"')
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\t":
            out.append("\\t")
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\x{ord(ch):02x}")
        else:
            out.append(ch)
    return "".join(out)


def quote_word(text: str, *, dollar: bool = False) -> str:
    """One systemd word holding exactly ``text`` (``dollar``: also escape $ as in ExecStart=)."""
    if "\0" in text:
        raise ValueError("a systemd value cannot hold a NUL character")
    if _SAFE_WORD_RE.fullmatch(text):
        return text
    quoted = _c_escape(text).replace("%", "%%")
    if dollar:
        quoted = quoted.replace("$", "$$")
    return f'"{quoted}"'


def _free_text(text: str) -> str:
    """Text for Description= and comments: one line, specifiers escaped."""
    return _c_escape(text).replace("%", "%%")


def _cpu_list(cpus: list[int]) -> str:
    """[0, 1, 2, 5] -> "0-2 5" (the list syntax of CPUAffinity= and AllowedCPUs=)."""
    return format_cpu_list(cpus, sep=" ")


# --- what the unit needs of the plan ---------------------------------------------------------


class _Problems:
    """What keeps this plan from becoming a unit, one ``plan.FIELD: problem`` line each."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def add(self, line: str) -> None:
        self.lines.append(line)

    def check_path(self, label: str, value: str) -> str | None:
        """``value`` normalized, if the service will be able to see it; else None and a problem."""
        if not value.startswith("/"):
            self.add(f"{label}: {value!r} is not an absolute path")
            return None
        if any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in value):
            self.add(f"{label}: {value!r} contains a control character")
            return None
        normal = posixpath.normpath(value)
        if normal.startswith("//"):
            normal = "/" + normal.lstrip("/")
        for prefix in HIDDEN_PREFIXES:
            if normal == prefix or normal.startswith(prefix + "/"):
                why = "PrivateTmp=yes" if prefix in ("/tmp", "/var/tmp") else "ProtectHome=yes"
                self.add(
                    f"{label}: {value} is hidden from the service by {why}; keep it outside "
                    f"{', '.join(HIDDEN_PREFIXES)} (models: under /var/lib/edgectl/models)")
                return None
        return normal


def _host_scope(host: str) -> str:
    """"local" (loopback only), "any" (all addresses) or "address" (one address or name)."""
    if host == "localhost":
        return "local"
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return "address"
    if address.is_loopback:
        return "local"
    if address.is_unspecified:
        return "any"
    return "address"


def _network_ordering(scope: str) -> str:
    if scope == "address":
        # Binding one address needs that address configured: wait for the network to be up.
        return "Wants=network-online.target\nAfter=network-online.target"
    # Loopback and the wildcard address can be bound before the network is up.
    return "After=network.target"


def _ip_access(scope: str) -> str:
    if scope == "local":
        return ("# Served on loopback only: no traffic to or from any other address.\n"
                "IPAddressAllow=localhost\nIPAddressDeny=any")
    return "# Served beyond loopback: clients may come from any address."


def _read_template(name: str = TEMPLATE) -> str:
    return (units_dir() / name).read_text(encoding="utf-8")


def _fill(template: str, values: Mapping[str, str], name: str = TEMPLATE) -> str:
    used: set[str] = set()

    def sub(match: re.Match[str]) -> str:
        key = match.group(1)
        if key not in values:
            raise KeyError(f"{name}: no value for @{key}@")
        used.add(key)
        return values[key]

    text = re.sub(r"@([A-Z][A-Z0-9_]*)@", sub, template)
    unused = set(values) - used
    if unused:
        raise KeyError(f"{name}: values never used: {sorted(unused)}")
    return text


def render_unit(plan: Plan, *, plan_path: str, python: str) -> str:
    """The text of ``edgectl-NAME.service`` for ``plan``.

    ``plan_path`` is where the plan is written (the worker reads it from there); ``python`` is
    the runtime interpreter (EDGECTL_RUNTIME_PYTHON). The plan itself was checked when it was
    read (``Plan.from_dict``); this refuses, naming every field, what a unit cannot carry.
    """
    model_path = _check_unit_inputs(plan, plan_path, python)
    return _fill(_read_template(), _unit_values(plan, plan_path, python, model_path))


def _check_unit_inputs(plan: Plan, plan_path: str, python: str) -> str:
    """Refuse, one ``plan.FIELD: problem`` per bad field, what a unit cannot carry; the model's path."""
    p = _Problems()
    try:
        own = unit_environment(plan.serve.name)  # validates the name
    except EdgectlError as exc:
        p.add(f"plan.serve.name: {exc.message}")
        own = {}
    host = plan.serve.host
    if any(ch.isspace() for ch in host) or any(ord(ch) < 0x20 for ch in host):
        p.add(f"plan.serve.host: {host!r} is not a host name or address")
    port = plan.serve.port
    if port < FIRST_UNPRIVILEGED_PORT:
        p.add(f"plan.serve.port: {port} is a privileged port and the service runs without "
              f"privileges: use --port {FIRST_UNPRIVILEGED_PORT} or above (e.g. 8000)")
    model_path = p.check_path("plan.model.path", plan.model.path)
    for key in sorted(plan.env):
        value = plan.env[key]
        if key in environment.TEST_ONLY:
            p.add(f"plan.env.{key}: a test-only fault injection; a deployed unit never carries it")
        elif key in own and value != own[key]:
            p.add(f"plan.env.{key}: the unit sets it to {own[key]!r} itself; remove it from the plan")
    p.check_path("plan path", plan_path)
    p.check_path("runtime python", python)
    if p.lines:
        raise EdgectlError(f"cannot write the systemd unit from this plan: {p.lines[0]}", details=p.lines[1:])
    assert model_path is not None
    return model_path


def _plan_environment(plan: Plan) -> str:
    """``Environment=`` lines for the plan's variables the unit does not set itself."""
    own = unit_environment(plan.serve.name)
    env_lines = [f"Environment={quote_word(f'{key}={plan.env[key]}')}" for key in sorted(plan.env) if key not in own]
    return "\n".join(env_lines) if env_lines else "# (the plan sets no variables)"


def _unit_values(plan: Plan, plan_path: str, python: str, model_path: str) -> dict[str, str]:
    """The values of the template (``TEMPLATE``), one per ``@NAME@``."""
    name = plan.serve.name
    # Timeouts are rounded up to whole seconds: a shorter limit than planned never helps.
    start_s, watchdog_s, stop_s = (math.ceil(t) for t in (plan.timeouts.start_s, plan.timeouts.watchdog_s,
                                                           plan.timeouts.stop_s))
    scope = _host_scope(plan.serve.host)
    exec_start = " ".join(launch.worker_command(quote_word(python, dollar=True), quote_word(plan_path, dollar=True),
                                         plan.levers.python_optimize))
    return {
        "UNIT": unit_name(name),
        "UNIT_STEM": f"edgectl-{name}",
        "NAME": name,
        "PLAN_PATH_NOTE": _c_escape(plan_path),
        "MODEL": _free_text(plan.model.name),
        # the KV dtype only when it is not the model's own (a plan that fits only with fp8 KV)
        "WEIGHT_FORMAT": _free_text(str(plan.weight_format) + ("" if plan.kv_cache_dtype == "auto"
                                                              else f", {plan.kv_cache_dtype} KV")),
        "ENDPOINT": _free_text(worker.host_port(plan.serve)),
        "NETWORK_ORDERING": _network_ordering(scope),
        "START_LIMIT_BURST": str(START_LIMIT_BURST),
        # Longer than START_LIMIT_BURST failed starts that each take the start timeout, the
        # stop timeout and the restart delay (systemd counts starts within a fixed window).
        "START_LIMIT_INTERVAL_S": str((START_LIMIT_BURST + 1) * (start_s + stop_s + RESTART_S)),
        "EXEC_START": exec_start,
        "STATE_DIR": state_dir(name),
        "CACHE_DIR": cache_dir(name),
        "START_S": str(start_s),
        "WATCHDOG_S": str(watchdog_s),
        "STOP_S": str(stop_s),
        "RESTART_S": str(RESTART_S),
        "ABORT_S": str(ABORT_S),
        "MEMORY_HIGH_BYTES": str(plan.memory.high_bytes),
        "MEMORY_MAX_BYTES": str(plan.memory.limit_bytes),
        "CPUS": _cpu_list(plan.cpus),
        "PLAN_ENVIRONMENT": _plan_environment(plan),
        "MODEL_PATH": quote_word(model_path),
        "IP_ACCESS": _ip_access(scope),
        "NOT_RESTARTABLE": " ".join(str(code) for code in worker.NOT_RESTARTABLE),
    }


# --- the node-label refresher of a Kubernetes node (edgectl/fleet/labels.py) ----------------

NFD_SERVICE = "edgectl-nfd.service"
NFD_TIMER = "edgectl-nfd.timer"


def render_nfd_units(*, python: str, out: str, refresh_interval: timedelta, expiry: timedelta) -> dict[str, str]:
    """``edgectl-nfd.service`` (``python -m edgectl probe --nfd --out OUT``) and its timer.

    ``out`` is the feature file (normally in NFD's features.d); its directory is the only one
    the service may write. ``refresh_interval``/``expiry``: how often the timer writes the labels
    and how long NFD keeps them (the fleet's ``labels.REFRESH_INTERVAL`` and ``labels.EXPIRY``).
    Raises EdgectlError naming a path the service could not use.
    """
    r = _Problems()
    checked_python = r.check_path("runtime python", python)
    checked_out = r.check_path("--out", out)
    if checked_out is not None and (checked_out == "/" or posixpath.basename(checked_out).startswith(".")):
        r.add(f"--out: {out!r}: NFD ignores files whose name starts with a dot; name a file")
        checked_out = None
    if r.lines:
        raise EdgectlError(f"cannot write {NFD_SERVICE}: {r.lines[0]}", details=r.lines[1:])
    assert checked_python and checked_out
    exec_start = " ".join([quote_word(checked_python, dollar=True), "-m", "edgectl", "probe", "--nfd",
                           "--out", quote_word(checked_out, dollar=True)])
    service = _fill(_read_template(NFD_SERVICE + ".in"), {
        "OUT": _c_escape(checked_out),
        "EXEC_START": exec_start,
        "OUT_DIR": quote_word(posixpath.dirname(checked_out)),
    }, NFD_SERVICE + ".in")
    timer = _fill(_read_template(NFD_TIMER + ".in"), {
        "INTERVAL_H": str(int(refresh_interval.total_seconds() // 3600)),
        "EXPIRY_H": str(int(expiry.total_seconds() // 3600)),
    }, NFD_TIMER + ".in")
    return {NFD_SERVICE: service, NFD_TIMER: timer}
