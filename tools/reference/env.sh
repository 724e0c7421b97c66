# shellcheck shell=bash
# Sourced by tools/reference/make-golden and tools/reference/bench-llamacpp.
#
# Provides:  REF_ROOT, REF_DIR, REF_PY (python of the reference venv), REF_MODEL
#            ref_ensure_venv, ref_ensure_model
#
# Environment knobs:
#   REF_VENV=/path/to/venv   use an existing venv (must already have requirements.txt installed;
#                            nothing is created or installed). Default: $REF_ROOT/.refvenv (git-ignored),
#                            created and populated from requirements.txt on first use.
#   REF_CMAKE_ARGS="..."     CMAKE_ARGS for building llama-cpp-python from source
#                            (default: -DGGML_NATIVE=ON -DGGML_OPENMP=ON)
#   REF_MODEL=/path.gguf     model file (default: models/SmolLM2-135M-Instruct.Q4_1.gguf)
#   REF_MODEL_SRC=/path.gguf where to copy the model from if REF_MODEL is missing

REF_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REF_ROOT="$(cd "$REF_DIR/../.." && pwd)"
REF_MODEL="${REF_MODEL:-$REF_ROOT/models/SmolLM2-135M-Instruct.Q4_1.gguf}"
REF_MODEL_SHA256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"

ref_log() { echo "[ref] $*" >&2; }

ref_check_imports() {
    "$1" - <<'PY' 2>/dev/null
import llama_cpp, gguf, numpy, safetensors, jinja2
PY
}

ref_ensure_venv() {
    local venv="${REF_VENV:-$REF_ROOT/.refvenv}"
    if [[ -n "${REF_VENV:-}" ]]; then
        if ! ref_check_imports "$venv/bin/python"; then
            ref_log "REF_VENV=$venv lacks llama_cpp/gguf/numpy/safetensors/jinja2"; return 1
        fi
    elif ! ref_check_imports "$venv/bin/python"; then
        ref_log "creating reference venv $venv (llama-cpp-python builds from source: ~10-20 min on 2 cores)"
        if ! command -v c++ >/dev/null || ! command -v cmake >/dev/null; then
            if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null; then
                apt-get update -qq && apt-get install -y -qq build-essential cmake >/dev/null
            else
                ref_log "need a C++ compiler and cmake (apt-get install build-essential cmake)"; return 1
            fi
        fi
        python3 -m venv "$venv"
        "$venv/bin/python" -m pip install -q --upgrade pip
        CMAKE_ARGS="${REF_CMAKE_ARGS:--DGGML_NATIVE=ON -DGGML_OPENMP=ON}" \
            "$venv/bin/python" -m pip install -q --no-binary llama-cpp-python -r "$REF_DIR/requirements.txt"
        ref_check_imports "$venv/bin/python" || { ref_log "venv $venv is broken"; return 1; }
    fi
    REF_PY="$venv/bin/python"
    export REF_PY
}

ref_ensure_model() {
    if [[ ! -f "$REF_MODEL" ]]; then
        local src="${REF_MODEL_SRC:-}"
        if [[ -z "$src" || ! -f "$src" ]]; then
            ref_log "model $REF_MODEL is missing; put SmolLM2-135M-Instruct.Q4_1.gguf there or set REF_MODEL_SRC"; return 1
        fi
        mkdir -p "$(dirname "$REF_MODEL")"
        cp "$src" "$REF_MODEL"
    fi
    if [[ "$(basename "$REF_MODEL")" == "SmolLM2-135M-Instruct.Q4_1.gguf" ]]; then
        local sum
        sum=$(sha256sum "$REF_MODEL" | cut -d' ' -f1)
        if [[ "$sum" != "$REF_MODEL_SHA256" ]]; then
            ref_log "unexpected sha256 $sum for $REF_MODEL (want $REF_MODEL_SHA256)"; return 1
        fi
    fi
}
