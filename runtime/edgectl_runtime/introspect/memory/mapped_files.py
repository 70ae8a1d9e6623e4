"""Which group a mapped file (or a Python source file) is counted under: the package that ships
it, the interpreter, the standard library, system libraries, the checkpoint."""

from __future__ import annotations

import os
import re
import sys
import sysconfig


def installed_site_dirs() -> list[str]:
    """This interpreter's site-packages folders, longest first."""
    dirs = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    return sorted((d.rstrip("/") + "/" for d in dirs), key=len, reverse=True)


def package_of(path: str, site_dirs: list[str], model_dir: str | None = None) -> str:
    """The group a mapped file is counted under."""
    if model_dir and path.startswith(model_dir.rstrip("/") + "/"):
        return "checkpoint (mapped)"
    if path.endswith(" (deleted)"):
        path = path[: -len(" (deleted)")]
    for site in site_dirs:
        if path.startswith(site):
            top = path[len(site):].split("/", 1)[0]
            top = re.sub(r"\.libs$", "", top)  # auditwheel's vendored libraries
            top = re.sub(r"(-[0-9][^/]*)?\.(dist|egg)-info$", "", top)
            if top.endswith((".so", ".py")):
                top = top.split(".", 1)[0]  # a top-level extension module: its own name
            return top or "site-packages"
    real = os.path.realpath(sys.executable)
    if path in (real, sys.executable) or re.search(r"/libpython3[^/]*\.so", path):
        return "python interpreter"
    stdlib = sysconfig.get_paths()["stdlib"].rstrip("/") + "/"
    if path.startswith(stdlib):
        return "python stdlib"
    if path.startswith(("/usr/lib/", "/lib/", "/lib64/", "/usr/lib64/", "/usr/local/lib/")):
        return "system libraries"
    return "other files"
