"""`edgectl bench MODEL`: interleaved, read-back-checked measurements with provenance."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from edgectl.bench.arms import ARMS, DEFAULT_ARMS
from edgectl.bench.speech.arms import ARMS as SPEECH_ARMS
from edgectl.bench.speech.arms import DEFAULT_ARMS as SPEECH_DEFAULT_ARMS
from edgectl.bench.vision.arms import ARMS as VISION_ARMS
from edgectl.bench.vision.arms import DEFAULT_ARMS as VISION_DEFAULT_ARMS
from edgectl.commands.options import ArmsMaxModelLen
from edgectl.errors import EdgectlError
from edgectl.output import emit, progress

# every arm of the table (edgectl/bench/arms.py), so the help cannot fall behind it
ARMS_HELP = (f"Comma list of arms. A speech model's (default {','.join(SPEECH_DEFAULT_ARMS)}): "
             f"{', '.join(SPEECH_ARMS)}. A vision-language model's (default {','.join(VISION_DEFAULT_ARMS)}): "
             f"{', '.join(VISION_ARMS)}. A text model's "
             f"(default {','.join(DEFAULT_ARMS)}; `all` for every one): " + ", ".join(ARMS) + ".")


def register(app: typer.Typer) -> None:
    @app.command("bench")
    def bench_cmd(
        model: Annotated[Optional[str], typer.Argument(help="A pulled catalog model (`edgectl models list`) or a model directory.")] = None,
        arms: Annotated[Optional[str], typer.Option("--arms", help=ARMS_HELP)] = None,
        passes: Annotated[int, typer.Option("--passes", help="Passes per arm, interleaved A B C A B C …; each a fresh server (3 or more to quote).")] = 3,
        out: Annotated[Path, typer.Option("--out", help="Directory for the artifact <date>-<host>-<model>.json and the servers' logs.")] = Path("results"),
        max_model_len: ArmsMaxModelLen = None,
        concurrency: Annotated[int, typer.Option("--concurrency", help="Also decode N streams at once per pass (aggregate tok/s); every arm is planned for N sequences, llama-server runs -np N.")] = 1,
        soak: Annotated[float, typer.Option("--soak", help="End every pass with SECONDS of mixed requests from several clients (chat, completions, streams, fresh prompts, dropped streams), the tree's PSS sampled: its drift (600 s to quote).")] = 0,
        record_profile: Annotated[bool, typer.Option("--record-profile", help="Write this device class's profile from the medians (needs `planned` and ≥ 3 passes).")] = False,
        profiles_dir: Annotated[Optional[Path], typer.Option("--profiles-dir", help="Where --record-profile writes (default $EDGECTL_PROFILES_DIR, /etc/edgectl/profiles).")] = None,
        plot: Annotated[bool, typer.Option("--plot", help="Also write a PNG next to the JSON (needs matplotlib).")] = False,
        seed: Annotated[int, typer.Option("--seed", help="Seed of the per-pass random prefill prompts (a vision model: of its test images).")] = 0,
        start_timeout: Annotated[float, typer.Option("--start-timeout", help="Seconds a server may take to become ready before its pass counts as crashed.")] = 1800.0,
        no_fidelity: Annotated[bool, typer.Option("--no-fidelity", help="Skip the fidelity prompts (agreement, KL, perplexity).")] = False,
        reference: Annotated[Optional[str], typer.Option("--reference", help="The arm fidelity is measured against (default: llama.cpp for a GGUF served as it is, else bf16, else stock).")] = None,
        llama_server: Annotated[Optional[str], typer.Option("--llama-server", help="The llama-server binary (default: a cached build, else PATH); llama-quantize beside it writes the llama.cpp-q4_0 and llama.cpp-q4_k_m arms' files.")] = None,
        llama_threads: Annotated[Optional[str], typer.Option("--llama-threads", help="llama-server's thread counts, comma list (or all): each llama.cpp arm runs once per count, as <arm>-t<N>; the best median is quoted as llama.cpp at its best (default: 1, 2 and every usable CPU).")] = None,
        build_llama_cpp: Annotated[bool, typer.Option("--build-llama-cpp", help="Build llama-server and llama-quantize once from llama-cpp-python's source archive (pip, cmake; several minutes), keeping its convert_hf_to_gguf.py, then bench if MODEL is given.")] = False,
        llama_cpp_isa: Annotated[Optional[str], typer.Option("--llama-cpp-isa", help="With --build-llama-cpp: build for this CPU's extensions up to this ISA only (avx2; avxvnni: AVX2 + AVX-VNNI), kept apart for runs held to it with ATEN_CPU_CAPABILITY=avx2 (and EDGECTL_KERNEL_ISA=avxvnni).")] = None,
        clips: Annotated[Optional[Path], typer.Option("--clips", help="A speech model only: a clip set's directory (its clips.json) instead of the shipped set.")] = None,
        as_json: Annotated[bool, typer.Option("--json", help="Print the artifact (schema edgectl.bench/1, a speech model's edgectl.bench.speech/1, a vision model's edgectl.bench.vision/1) instead of the table.")] = False,
    ) -> None:
        """Measure arms (stock vLLM, edgectl's plan, its levers, llama.cpp) in interleaved passes; refuse to quote an incomplete grid."""
        from edgectl.contract import environment

        if llama_cpp_isa is not None and not build_llama_cpp:
            raise EdgectlError("--llama-cpp-isa goes with --build-llama-cpp (a bench held to AVX2 with "
                               "ATEN_CPU_CAPABILITY=avx2 picks the held build by itself)")
        if build_llama_cpp:
            from edgectl.llamacpp import build_llama_cpp as build

            path = build(os.environ, environment.read("EDGECTL_RUNTIME_PYTHON", os.environ), progress,
                         isa=llama_cpp_isa)
            if model is None:
                emit(_Built(str(path)), as_json)
                return
        if model is None:
            raise EdgectlError("give the MODEL to bench (e.g. `edgectl bench smollm2-135m`), or --build-llama-cpp alone")

        from edgectl.bench.speech.core import is_speech_model
        from edgectl.bench.vision.core import is_vision_model

        if is_vision_model(model, os.environ):
            from edgectl.bench.vision.core import VisionBenchOptions, run_vision_bench

            text_only = {"--max-model-len": max_model_len is not None, "--concurrency": concurrency != 1,
                         "--soak": soak != 0, "--record-profile": record_profile, "--profiles-dir": profiles_dir is not None,
                         "--plot": plot, "--no-fidelity": no_fidelity, "--reference": reference is not None,
                         "--clips": clips is not None}
            given = [flag for flag, set_ in text_only.items() if set_]
            if given:
                raise EdgectlError(f"{', '.join(given)}: not a vision model's option; {model} is a vision-language "
                                   "model (its bench takes --arms, --passes, --out, --seed, --start-timeout, "
                                   "--llama-server, --llama-threads, --json)")
            vision = VisionBenchOptions(model=model, arms=arms, passes=passes, out=out, seed=seed,
                                        start_timeout_s=start_timeout, llama_server=llama_server,
                                        llama_threads=llama_threads, argv=sys.argv)
            emit(run_vision_bench(vision, os.environ, progress), as_json)
            return
        if is_speech_model(model, os.environ):
            from edgectl.bench.speech.core import SpeechBenchOptions, run_speech_bench

            text_only = {"--max-model-len": max_model_len is not None, "--concurrency": concurrency != 1,
                         "--soak": soak != 0, "--record-profile": record_profile, "--profiles-dir": profiles_dir is not None,
                         "--plot": plot, "--seed": seed != 0, "--no-fidelity": no_fidelity, "--reference": reference is not None,
                         "--llama-server": llama_server is not None}
            given = [flag for flag, set_ in text_only.items() if set_]
            if given:
                raise EdgectlError(f"{', '.join(given)}: a text model's option; {model} is a speech model "
                                   "(its bench takes --arms, --passes, --out, --clips, --start-timeout, --json)")
            speech = SpeechBenchOptions(model=model, arms=arms, passes=passes, out=out, clips=clips,
                                        start_timeout_s=start_timeout, argv=sys.argv)
            emit(run_speech_bench(speech, os.environ, progress), as_json)
            return
        if clips is not None:
            raise EdgectlError(f"--clips: a speech model's option; {model} is a text model")

        from edgectl.bench.core import BenchOptions, run_bench

        opts = BenchOptions(model=model, arms=arms, passes=passes, out=out, max_model_len=max_model_len,
                            record_profile=record_profile, profiles_dir=profiles_dir, plot=plot, seed=seed,
                            start_timeout_s=start_timeout, llama_server=llama_server, fidelity=not no_fidelity,
                            concurrency=concurrency, soak_s=soak, reference=reference, llama_threads=llama_threads,
                            argv=sys.argv)
        emit(run_bench(opts, os.environ, progress), as_json)


class _Built:
    def __init__(self, path: str) -> None:
        self.path = path

    def to_dict(self) -> dict[str, str]:
        return {"llama_server": self.path}

    def render_text(self) -> str:
        return f"llama-server built: {self.path} (llama-quantize and the converter beside it)"
