"""Models built on iris-fw's ops: :mod:`iris_fw.models.llama`, a tensor-parallel Llama decoder
whose weights come from a Hugging Face ``transformers`` ``LlamaForCausalLM``.

Nothing is imported here (``transformers`` is only needed by the code that reads a model)."""
