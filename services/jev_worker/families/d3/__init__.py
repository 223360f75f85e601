"""D3 (family `d3`): vLLM Semantic Router's Decision 3.0 code-readout v1 package served with its own prompt
module's text (readout.py), on the causal-lm or noncausal-lm backend as its decision_config.json says."""
