"""Run by :mod:`edgectl.probe.cpuid` as ``python -I -S _cpuid_helper.py [--amx]``; prints JSON.

Stand-alone on purpose (standard library only, no edgectl import): it executes raw machine code
(``cpuid``, ``xgetbv``) and, with ``--amx``, asks the kernel for the AMX tile-data permission.
Both happen in this short-lived process so that
- a fault (SIGILL/SIGSEGV on an exotic hypervisor or a W^X-hardened kernel) kills only this
  helper, and the probe reports the cpuid view as unknown instead of crashing;
- the AMX permission, which the kernel grants per *process* and never takes back
  (Documentation/arch/x86/xstate.rst), is not left on the edgectl CLI process. Granting it
  in-process would be harmless but it would make the probe's own process differ from the
  serving process it describes: the server has to request it itself (oneDNN and PyTorch do).

Output: {"leaves": {"0": [eax, ebx, ecx, edx], "1": [...], "7.0": [...], "7.1": [...]},
         "xcr0": int | null, "amx": {"supported_mask": int | null, "request": "granted" |
         "denied" | "unsupported", "errno": int | null} | null, "error": str | null}
Decoding is done by the caller (and tested there): this file only reads registers.
"""

import ctypes
import json
import mmap
import sys

# x86-64 System V: cpuid(leaf=edi, subleaf=esi, out=rdx) stores eax, ebx, ecx, edx at out[0..3].
_CPUID_CODE = bytes([
    0x53,                    # push rbx            (rbx is callee-saved; cpuid clobbers it)
    0x89, 0xF8,              # mov eax, edi
    0x89, 0xF1,              # mov ecx, esi
    0x49, 0x89, 0xD0,        # mov r8, rdx
    0x0F, 0xA2,              # cpuid
    0x41, 0x89, 0x00,        # mov [r8], eax
    0x41, 0x89, 0x58, 0x04,  # mov [r8+4], ebx
    0x41, 0x89, 0x48, 0x08,  # mov [r8+8], ecx
    0x41, 0x89, 0x50, 0x0C,  # mov [r8+12], edx
    0x5B,                    # pop rbx
    0xC3,                    # ret
])

# xgetbv(ecx=edi) -> edx:eax as one 64-bit value. Faults (#UD) unless CPUID.1:ECX.OSXSAVE[27] = 1,
# so it is only called after that bit has been checked.
_XGETBV_CODE = bytes([
    0x89, 0xF9,              # mov ecx, edi
    0x0F, 0x01, 0xD0,        # xgetbv
    0x48, 0xC1, 0xE2, 0x20,  # shl rdx, 32
    0x48, 0x09, 0xD0,        # or rax, rdx
    0xC3,                    # ret
])

_SYS_ARCH_PRCTL = 158  # x86-64 syscall number (arch/x86/entry/syscalls/syscall_64.tbl)
_ARCH_GET_XCOMP_SUPP = 0x1021  # arch/x86/include/uapi/asm/prctl.h
_ARCH_REQ_XCOMP_PERM = 0x1023
_XFEATURE_XTILEDATA = 18
_EINVAL, _EOPNOTSUPP = 22, 95


def _function(code, restype, argtypes):
    buf = mmap.mmap(-1, mmap.PAGESIZE, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
    buf.write(code)
    address = ctypes.addressof(ctypes.c_char.from_buffer(buf))
    return buf, ctypes.CFUNCTYPE(restype, *argtypes)(address)


def main():
    out = {"leaves": {}, "xcr0": None, "amx": None, "error": None}
    try:
        keep, cpuid = _function(_CPUID_CODE, None, (ctypes.c_uint32, ctypes.c_uint32, ctypes.c_void_p))
        regs = (ctypes.c_uint32 * 4)()

        def leaf(n, sub=0):
            cpuid(n, sub, ctypes.addressof(regs))
            return [int(r) for r in regs]

        out["leaves"]["0"] = leaf(0)
        max_leaf = out["leaves"]["0"][0]
        if max_leaf >= 1:
            out["leaves"]["1"] = leaf(1)
        if max_leaf >= 7:
            out["leaves"]["7.0"] = leaf(7, 0)
            if out["leaves"]["7.0"][0] >= 1:  # EAX of 7.0 = highest sub-leaf
                out["leaves"]["7.1"] = leaf(7, 1)
        if "1" in out["leaves"] and out["leaves"]["1"][2] & (1 << 27):  # OSXSAVE
            keep2, xgetbv = _function(_XGETBV_CODE, ctypes.c_uint64, (ctypes.c_uint32,))
            out["xcr0"] = int(xgetbv(0))
    except Exception as exc:  # e.g. mmap PROT_EXEC refused by SELinux execmem
        out["error"] = f"cpuid could not be executed: {exc}"

    if "--amx" in sys.argv:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.syscall.restype = ctypes.c_long
        mask = ctypes.c_uint64(0)
        supp = libc.syscall(ctypes.c_long(_SYS_ARCH_PRCTL), ctypes.c_long(_ARCH_GET_XCOMP_SUPP),
                            ctypes.byref(mask))
        supported = int(mask.value) if supp == 0 else None
        rc = libc.syscall(ctypes.c_long(_SYS_ARCH_PRCTL), ctypes.c_long(_ARCH_REQ_XCOMP_PERM),
                          ctypes.c_long(_XFEATURE_XTILEDATA))
        err = ctypes.get_errno() if rc != 0 else None
        if rc == 0:
            request = "granted"
        elif err in (_EINVAL, _EOPNOTSUPP):  # kernel older than 5.16 / tile data not supported here
            request = "unsupported"
        else:  # refused: e.g. an installed sigaltstack too small for the AMX frame, a seccomp filter
            request = "denied"
        out["amx"] = {"supported_mask": supported, "request": request, "errno": err}

    sys.stdout.write(json.dumps(out))


if __name__ == "__main__":
    main()
