"""Build the small synthetic GGUF fixtures of tests/data/fixtures/ (one recipe per architecture).

Each fixture is a tiny seeded random-weight transformers model in the real tensor layout, saved with
SmolLM2's real tokenizer (transformers reads it from the SmolLM2 GGUF and saves it; llama.cpp's
converter recognizes it as pre-tokenizer `smollm`), then converted by llama.cpp's
convert_hf_to_gguf.py (--outtype f16). Every weight is rounded to float16 *before* saving, so the f16
GGUF holds exactly the transformers model's weights and that model (fp32, in memory) is the logits
reference (recorded by scripts/make_model_refs.py from the saved HF directory).

Shapes follow Qwen3-0.6B's ratios where a 49,152-token vocab allows a file of a few MB: head_dim 128,
GQA 2:1 (2 query heads, 1 kv head), n_ff = 3 n_embd, tied embeddings; n_embd 16 keeps the f16
embedding at 1.6 MB (the tokenizer's vocab and merges add another 1.7 MB to each file). Norm weights and biases are randomized too (transformers initializes them to
1 and 0, which would leave q/k norms and QKV biases untested).

Usage: python scripts/make_fixtures.py [NAME ...]     (default: all recipes)
  -> tests/data/fixtures/NAME.gguf, HF source in $REFLEX_FIXTURE_CACHE/NAME (default
     ~/.cache/reflex/fixtures). Needs torch, transformers, gguf and llama.cpp's converter unpacked
     under vendor/llama.cpp (see ../shared/GUIDE.md); none of these is needed in CI.
"""
import os
import subprocess
import sys

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS = os.environ.get("REFLEX_MODELS", os.path.expanduser("~/.cache/reflex/models"))
CACHE = os.environ.get("REFLEX_FIXTURE_CACHE", os.path.expanduser("~/.cache/reflex/fixtures"))
OUT_DIR = os.path.join(ROOT, "tests", "data", "fixtures")
VENDOR = os.path.join(ROOT, "vendor", "llama.cpp")
TOKENIZER_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"

_SHAPE = dict(vocab_size=49152, hidden_size=16, intermediate_size=48, num_hidden_layers=2,
              num_attention_heads=2, num_key_value_heads=1, head_dim=128, max_position_embeddings=2048,
              rms_norm_eps=1e-6, rope_theta=1000000.0, tie_word_embeddings=True,
              initializer_range=0.25)


def _qwen2():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    return Qwen2ForCausalLM(Qwen2Config(**_SHAPE))


def _qwen3():
    from transformers import Qwen3Config, Qwen3ForCausalLM

    return Qwen3ForCausalLM(Qwen3Config(**_SHAPE))


def _qwen3moe():
    # Qwen3-30B-A3B's layout (head_dim 128, GQA, every layer sparse, no shared expert, untied output,
    # norm_topk_prob true) scaled down: 8 experts, top-2, n_ff_exp 16; n_embd 8 keeps the two f16
    # vocab matrices (untied, like the real family) at 0.8 MB each
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    shape = dict(_SHAPE, hidden_size=8, intermediate_size=24, tie_word_embeddings=False)
    return Qwen3MoeForCausalLM(Qwen3MoeConfig(**shape, moe_intermediate_size=16, num_experts=8,
                                              num_experts_per_tok=2, norm_topk_prob=True,
                                              decoder_sparse_step=1, mlp_only_layers=[]))


def _qwen35():
    # Qwen3.5's dense hybrid (Qwen3_5ForCausalLM) scaled down: linear-attention (Gated DeltaNet) and
    # gated full-attention layers alternating (2 of each), GQA 2:1, head_dim 32 with partial rotary
    # 0.25 (n_rot 8, M-RoPE sections [2, 1, 1] summing to n_rot / 2), DeltaNet with 2 key heads and 4
    # value heads (so the converter's grouped -> tiled V-head reorder matters), conv kernel 4, tied
    # embeddings like the small Qwen3.5 models
    from transformers import Qwen3_5TextConfig, Qwen3_5ForCausalLM

    shape = dict(_SHAPE, num_hidden_layers=4, head_dim=32)
    cfg = Qwen3_5TextConfig(**shape, linear_conv_kernel_dim=4, linear_key_head_dim=16,
                            linear_value_head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4,
                            layer_types=["linear_attention", "full_attention"] * 2,
                            rope_parameters=dict(rope_type="default", rope_theta=10000000.0,
                                                 partial_rotary_factor=0.25, mrope_section=[2, 1, 1],
                                                 mrope_interleaved=True))
    return Qwen3_5ForCausalLM(cfg)


MISTRAL_SWA = 6  # tokens; the reference prompts are 7-20 tokens, so the window cuts in


def _mistral_swa():
    # Mistral-style llama: GQA 2:1 with a sliding window. head_dim = n_embd / n_head because the llama
    # GGUF layout has no separate key_length for llama.cpp's llama graph.
    from transformers import MistralConfig, MistralForCausalLM

    shape = dict(_SHAPE, hidden_size=32, intermediate_size=64, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=8, rope_theta=10000.0)
    return MistralForCausalLM(MistralConfig(**shape, sliding_window=MISTRAL_SWA))


def _deepseek2():
    # DeepSeek-V3's layout scaled down: MLA with q_lora_rank set (q_a / q_a_norm / q_b), compressed KV
    # (kv_lora_rank 10 + a decoupled 8-dim RoPE part, interleaved pairs), YaRN (factor 4 over an
    # original 64-token context, mscale == mscale_all_dim as in the released configs), 2 dense layers
    # then 2 MoE layers of 4 routed experts (top-2, sigmoid scores + e_score_correction_bias, normalized,
    # routed_scaling_factor 2.5) plus 1 shared expert, untied output; n_group = topk_group = 1 (group-
    # limited routing trivially satisfied). Distinct sizes so a transposed weight fails a shape check;
    # n_ff_exp 4 because transformers' grouped-mm experts need 16-byte strides.
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    cfg = DeepseekV3Config(
        vocab_size=49152, hidden_size=8, intermediate_size=24, moe_intermediate_size=4,
        num_hidden_layers=4, first_k_dense_replace=2, num_attention_heads=2, num_key_value_heads=2,
        n_shared_experts=1, n_routed_experts=4, num_experts_per_tok=2, n_group=1, topk_group=1,
        routed_scaling_factor=2.5, norm_topk_prob=True, kv_lora_rank=10, q_lora_rank=12,
        qk_rope_head_dim=8, qk_nope_head_dim=6, v_head_dim=5, max_position_embeddings=256,
        rms_norm_eps=1e-6, tie_word_embeddings=False, initializer_range=0.25,
        rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                         "original_max_position_embeddings": 64, "beta_fast": 32.0, "beta_slow": 1.0,
                         "mscale": 1.0, "mscale_all_dim": 1.0})
    cfg.scoring_func = "sigmoid"  # as DeepSeek-V3's config.json: the converter writes expert_gating_func
    model = DeepseekV3ForCausalLM(cfg)
    g = torch.Generator().manual_seed(80)
    with torch.no_grad():  # e_score_correction_bias is a buffer (zeros), which _randomize does not touch
        for name, buf in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                buf.copy_((0.3 * torch.randn(buf.shape, generator=g)).half().float())
    return model


def _deepseek2_lite():
    # DeepSeek-V2-Lite's layout scaled down: no q_lora_rank (plain attn_q), plain RoPE (no scaling),
    # softmax scoring without a selection bias or renormalization (topk_method greedy, norm_topk_prob
    # false), routed_scaling_factor 1.5, 2 shared experts (width 2 n_ff_exp); MLA and the
    # dense / MoE split as deepseek2's V3 recipe.
    from transformers import DeepseekV2Config, DeepseekV2ForCausalLM

    cfg = DeepseekV2Config(
        vocab_size=49152, hidden_size=8, intermediate_size=24, moe_intermediate_size=4,
        num_hidden_layers=4, first_k_dense_replace=2, num_attention_heads=2, num_key_value_heads=2,
        n_shared_experts=2, n_routed_experts=4, num_experts_per_tok=2, topk_method="greedy",
        n_group=1, topk_group=1, routed_scaling_factor=1.5, norm_topk_prob=False, kv_lora_rank=10,
        q_lora_rank=None, qk_rope_head_dim=8, qk_nope_head_dim=6, v_head_dim=5,
        max_position_embeddings=256, rms_norm_eps=1e-6, tie_word_embeddings=False,
        initializer_range=0.25, rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    cfg.scoring_func = "softmax"  # as DeepSeek-V2's config.json
    return DeepseekV2ForCausalLM(cfg)


def _granitehybrid():
    # Granite 4.0-H-Tiny/Small's layout (GraniteMoeHybridForCausalLM) scaled down: Mamba-2 and attention
    # layers interleaved (2 of each, per layer_types), no positional embedding on attention (Granite
    # 4.0-H is NoPE; the converter writes rope.scaling.finetuned false for hybrids), MoE with a shared
    # expert (4 experts, top-2), every Granite multiplier != 1. Mamba-2: expand 2 (d_inner 32 =
    # 2 n_embd, as llama.cpp requires), 4 heads x 8, 2 groups (so the head -> group mapping matters),
    # d_state 8, conv kernel 4 with bias; tied embeddings like the real family
    from transformers import GraniteMoeHybridConfig, GraniteMoeHybridForCausalLM

    # embedding 4 / residual 0.6 / init 0.5 rather than the real 12 / 0.22: with tied embeddings a x12
    # embedding drowns the random layers and greedy decoding just repeats the last prompt token
    shape = dict(_SHAPE, intermediate_size=16, num_hidden_layers=4, head_dim=8, initializer_range=0.5)
    cfg = GraniteMoeHybridConfig(**shape, layer_types=["mamba", "attention", "mamba", "attention"],
                                 position_embedding_type="nope", embedding_multiplier=4.0,
                                 attention_multiplier=0.2, residual_multiplier=0.6, logits_scaling=4.0,
                                 num_local_experts=4, num_experts_per_tok=2, shared_intermediate_size=24,
                                 mamba_n_heads=4, mamba_d_head=8, mamba_n_groups=2, mamba_d_state=8,
                                 mamba_d_conv=4, mamba_expand=2, mamba_conv_bias=True,
                                 mamba_proj_bias=False, mamba_chunk_size=4)
    return GraniteMoeHybridForCausalLM(cfg)


GEMMA4_SWA = 4  # tokens; the reference prompts are 7-20 tokens, so the window cuts in


def _gemma4():
    # Gemma 4 text decoder with every structural feature the converter maps: sliding/full layer types
    # (2 of each with their own KV, then 2 KV-shared layers reusing the last S and F layer's cache),
    # per-type head_dim and kv-head count, proportional partial RoPE on full layers, k == v on full
    # layers (attention_k_eq_v: no v_proj), double-wide MLP on the KV-shared layers, per-layer token
    # embeddings (PLE), layer_scalar, final logit softcapping (3.0 so it bites on these small logits).
    # n_embd 8 and PLE width 2 keep the two 49,152-row f16 tables at 0.8 + 1.2 MB.
    from transformers import Gemma4ForCausalLM, Gemma4TextConfig

    cfg = Gemma4TextConfig(
        vocab_size=49152, hidden_size=8, intermediate_size=24, num_hidden_layers=6,
        num_attention_heads=2, num_key_value_heads=1, head_dim=32, global_head_dim=64,
        num_global_key_value_heads=2, max_position_embeddings=2048, rms_norm_eps=1e-6,
        tie_word_embeddings=True, initializer_range=0.25, sliding_window=GEMMA4_SWA,
        layer_types=["sliding_attention", "full_attention"] * 3, final_logit_softcapping=3.0,
        vocab_size_per_layer_input=49152, hidden_size_per_layer_input=2, attention_k_eq_v=True,
        num_kv_shared_layers=2, use_double_wide_mlp=True, enable_moe_block=False,
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                         "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                            "rope_theta": 1000000.0}})
    model = Gemma4ForCausalLM(cfg)
    g = torch.Generator().manual_seed(40)
    with torch.no_grad():  # layer_scalar is a buffer (ones), which _randomize does not touch
        for name, buf in model.named_buffers():
            if name.endswith("layer_scalar"):
                buf.copy_((0.5 + torch.rand(buf.shape, generator=g)).half().float())
    return model


def _gemma4moe():
    # Gemma 4 26B-A4B's layer: the dense GeGLU MLP (its shared expert) plus a routed MoE block (router
    # with weightless RMSNorm, `scale`, per_expert_scale; fused gate_up experts), each with its own
    # post-norm; 4 experts top-2. Also the path gemma4 leaves out: v_proj on global layers (k_eq_v
    # false), no PLE, no KV sharing. Layers local/global alternating, 2 of each.
    from transformers import Gemma4ForCausalLM, Gemma4TextConfig

    cfg = Gemma4TextConfig(
        vocab_size=49152, hidden_size=8, intermediate_size=24, num_hidden_layers=4,
        num_attention_heads=2, num_key_value_heads=1, head_dim=32, global_head_dim=64,
        num_global_key_value_heads=2, max_position_embeddings=2048, rms_norm_eps=1e-6,
        tie_word_embeddings=True, initializer_range=0.25, sliding_window=GEMMA4_SWA,
        layer_types=["sliding_attention", "full_attention"] * 2, final_logit_softcapping=3.0,
        hidden_size_per_layer_input=0, attention_k_eq_v=False, num_kv_shared_layers=0,
        enable_moe_block=True, num_experts=4, top_k_experts=2, moe_intermediate_size=16,
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                         "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                            "rope_theta": 1000000.0}})
    return Gemma4ForCausalLM(cfg)


def _gemma4_conditioning(model, seed):
    # Two places where the random weights of _randomize make a Gemma 4 fixture amplify a float16 KV
    # cache's 5e-4 rounding into logit changes of up to 0.7 of max|logit| (issue 8; measured with
    # NumpyBackend(kv_f16=True), see docs/reference.md):
    # - attention scale is 1.0 on RMS-normed q and k, so norm weights ~1 give scores of std
    #   ~sqrt(head_dim) (5.7-8): near-argmax softmax over near-tied keys. q_norm / k_norm weights
    #   ~head_dim^-1/4 give scores of std ~1, as trained models' learned norms do;
    # - the PLE branch rms-normalizes proj(gelu_tanh(per_layer_input_gate(x)) * pe) whose inner width
    #   is only hidden_size_per_layer_input (2): with gate values of std ~2.5, gelu_tanh sends both to
    #   ~0 for about a quarter of the tokens and the post-norm blows their rounding up to unit scale.
    #   Gate weights of 0.05 keep the gates (std ~0.5) in gelu's near-linear range.
    # Still random (seeded), so every weight stays tested.
    g = torch.Generator().manual_seed(seed + 1000)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("q_norm.weight", "k_norm.weight")):
                c = p.shape[0] ** -0.25
                p.copy_((c * (1.0 + 0.2 * torch.randn(p.shape, generator=g))).half().float())
            elif name.endswith("per_layer_input_gate.weight"):
                p.copy_((PLE_GATE_STD * torch.randn(p.shape, generator=g)).half().float())


PLE_GATE_STD = 0.05


def _qwen3moe_conditioning(model, seed):
    # Unlike gemma4, qwen3moe's fixture does not amplify a float16 KV cache's rounding (issue 8;
    # measured with NumpyBackend(kv_f16=True) vs float32 KV, see docs/reference.md): scores are scaled
    # by head_dim^-1/2 (std 0.8, no near-argmax softmax), and K/V rows rounded by 2.1e-4 (relative L2)
    # move the router logits by 4.6e-4 of their std (median of the max over the 8 experts). But top-2
    # routing is a discontinuity: 1.1e-3 of the (token, layer) decisions have a 2nd-3rd router margin
    # inside that movement (60 random 64-token prompts), so the ~530 decisions of the recorded cases
    # expect 0.6 flips; case 1 got one (margin 2.7e-4 at decode step 4, layer 0), and as the swapped
    # expert carries about half of a top-2 FFN output, one flip moves the logits by 1e-2..0.3 of
    # max|logit|: greedy diverged at step 16 (gap 9e-2).
    # Scaling the router cannot help (margin and movement scale together); the movement is set by the
    # share of the router input read from the cache. _randomize's std 0.25 gave attn_output a gain of
    # 4 at fan-in n_head*head_dim (256) and the token embedding an RMS of 0.25, so attention output was
    # 5.5x the embedding at layer 0 (row norms 3.8 vs 0.7). A unit-RMS embedding (the scale RMSNorm
    # gives) and attn_output at gain 1/4 make attention 8% of the residual (0.24 vs 2.97): movement
    # 2.8e-5 of the router std, near-tie fraction 5.6e-5 (20x fewer; gain 1: 2.7e-4, gain 1/2:
    # 1.1e-4, and that draw still had a decision at margin 0.9x its movement). Attention is qwen3's
    # (imported), tested at full share by the qwen3 fixture; this one exists for the MoE FFN.
    # Still random (seeded), so every weight stays tested.
    g = torch.Generator().manual_seed(seed + 1000)
    cfg = model.config
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("embed_tokens.weight"):
                p.copy_(torch.randn(p.shape, generator=g).half().float())
            elif name.endswith("o_proj.weight"):
                std = QWEN3MOE_O_GAIN * (cfg.num_attention_heads * cfg.head_dim) ** -0.5
                p.copy_((std * torch.randn(p.shape, generator=g)).half().float())


QWEN3MOE_O_GAIN = 0.25


# name -> (builder, seed)
RECIPES = {
    "qwen2": (_qwen2, 2),
    "qwen3": (_qwen3, 3),
    "qwen3moe": (_qwen3moe, 4),
    "mistral_swa": (_mistral_swa, 5),
    "qwen35": (_qwen35, 6),
    "deepseek2": (_deepseek2, 8),
    "deepseek2_lite": (_deepseek2_lite, 9),
    "granitehybrid": (_granitehybrid, 9),
    "gemma4": (_gemma4, 6),
    "gemma4moe": (_gemma4moe, 7),
}
# metadata the converter does not write but the architecture defines: llama.cpp's llama converter
# drops Mistral's sliding_window, so the fixture gets `llama.attention.sliding_window` added after
# conversion (a rewrite with gguf.GGUFWriter; tensors are copied byte for byte)
EXTRA_KV = {"mistral_swa": {"llama.attention.sliding_window": MISTRAL_SWA}}
# config.json keys put back to the checkpoint spelling before conversion: transformers 5 saves
# GraniteMoeHybrid's layer_types as linear_attention/full_attention, but the released Granite 4.0-H
# configs (and llama.cpp's converter, which then finds no attention layer) use mamba/attention
HF_CONFIG = {"granitehybrid": {"layer_types": ["mamba", "attention", "mamba", "attention"]}}
# weight changes after _randomize (model, seed)
POST_RANDOMIZE = {"gemma4": _gemma4_conditioning, "gemma4moe": _gemma4_conditioning,
                  "qwen3moe": _qwen3moe_conditioning}
# extra converter flags: Qwen3.5's converter expects an MTP head unless told there is none
CONVERT_ARGS = {"qwen35": ["--no-mtp"]}


def _add_kv(path, extra):
    import gguf

    r = gguf.GGUFReader(path)
    tmp = path + ".tmp"
    w = gguf.GGUFWriter(tmp, arch=str(r.fields["general.architecture"].contents()))
    for name, field in r.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        vt = field.types[0]
        if vt == gguf.GGUFValueType.ARRAY:
            w.add_key_value(name, field.contents(), vt, sub_type=field.types[-1])
        else:
            w.add_key_value(name, field.contents(), vt)
    for k, v in extra.items():
        w.add_uint32(k, v)
    for t in r.tensors:
        w.add_tensor(t.name, np.asarray(t.data), raw_shape=list(reversed(t.shape.tolist())),
                     raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    os.replace(tmp, path)


# Runs the converter unchanged, except that AutoTokenizer loads tokenizer.json as saved: transformers 5
# maps model_type qwen2 to Qwen2Tokenizer, which swaps in Qwen2's pre-tokenizer regex, so the
# converter's pre-tokenizer hash no longer matches SmolLM2's (`smollm`) and it refuses the vocab.
_CONVERT = """
import runpy, sys
import transformers
from transformers.tokenization_utils_tokenizers import TokenizersBackend
transformers.AutoTokenizer.from_pretrained = staticmethod(
    lambda path, *a, **k: TokenizersBackend.from_pretrained(path))
sys.argv = sys.argv[1:]
sys.path.insert(0, __import__("os").path.dirname(sys.argv[0]))
if __import__("os").environ.get("REFLEX_GPT2_VOCAB"):
    import conversion.gemma
    conversion.gemma.Gemma4Model.set_vocab = lambda self: self._set_vocab_gpt2()
runpy.run_path(sys.argv[0], run_name="__main__")
"""
# Gemma4Model.set_vocab accepts only a Llama-style (byte-fallback) BPE tokenizer.json; for those
# recipes the wrapper swaps in the converter's own generic GPT-2 BPE vocab writer, so the fixture
# carries SmolLM2's tokenizer like the others (tensors and hyperparameters are written unchanged)
GPT2_VOCAB = {"gemma4", "gemma4moe"}


def _randomize(model, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
            elif name.endswith(".bias"):
                p.copy_(0.5 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(model.config.initializer_range * torch.randn(p.shape, generator=g))
            p.copy_(p.half().float())  # exactly representable in the f16 GGUF


def build(name):
    from transformers import AutoTokenizer

    builder, seed = RECIPES[name]
    torch.manual_seed(seed)
    hf_dir = os.path.join(CACHE, name)
    os.makedirs(hf_dir, exist_ok=True)
    tok = AutoTokenizer.from_pretrained(MODELS, gguf_file=TOKENIZER_GGUF)
    model = builder()
    model.config.bos_token_id = tok.bos_token_id
    model.config.eos_token_id = tok.eos_token_id
    _randomize(model, seed)
    if name in POST_RANDOMIZE:
        POST_RANDOMIZE[name](model, seed)
    model.save_pretrained(hf_dir, safe_serialization=True)
    tok.save_pretrained(hf_dir)
    if name in HF_CONFIG:
        import json
        cfg_path = os.path.join(hf_dir, "config.json")
        with open(cfg_path) as fh:
            cfg = json.load(fh)
        cfg.update(HF_CONFIG[name])
        with open(cfg_path, "w") as fh:
            json.dump(cfg, fh, indent=2)
    os.makedirs(OUT_DIR, exist_ok=True)
    out = os.path.join(OUT_DIR, f"{name}.gguf")
    env = dict(os.environ, PYTHONPATH=os.path.join(VENDOR, "gguf-py"))
    if name in GPT2_VOCAB:
        env["REFLEX_GPT2_VOCAB"] = "1"
    conv = os.path.join(VENDOR, "convert_hf_to_gguf.py")
    subprocess.run([sys.executable, "-c", _CONVERT, conv, hf_dir, "--outfile", out, "--outtype", "f16"]
                   + CONVERT_ARGS.get(name, []),
                   check=True, env=env)
    if name in EXTRA_KV:
        _add_kv(out, EXTRA_KV[name])
    print(f"{name}: {out} ({os.path.getsize(out) / 1e6:.2f} MB), HF source {hf_dir}")


def main():
    for name in sys.argv[1:] or list(RECIPES):
        build(name)


if __name__ == "__main__":
    main()
