"""Real architectures from Hugging Face ``transformers``, built from small configs with random weights.

``get_workload("hf:llama")`` and friends: the model classes users migrate (Llama, Qwen, Mixtral,
BERT, ViT, Whisper, T5 ...) exactly as ``transformers`` implements them, shrunk to a few layers
of width 64 so that a train and an inference step take well under a second on a laptop CPU.
Nothing is downloaded: every model is built from its config class (``transformers`` is the
``models`` extra; ImportError with the install command when it is missing, raised by ``build``).

What each architecture is lives in :data:`ARCHITECTURES` (data, one row each): its family, its
``transformers`` config and model classes, the task (which decides the batch, the loss and the
inference path) and the config fields that make it small. Dropout that ``transformers`` applies
functionally (not through an ``nn.Dropout`` module the precision check can switch off) is set
to 0 in these configs; module dropout is kept, so training runs the ops it runs for users.

Tasks: ``causal-lm`` (next-token loss; inference is greedy decoding with the KV cache),
``masked-lm``, ``image-classification``, ``contrastive`` (CLIP's image-text loss),
``ctc`` (speech recognition with CTC loss), ``seq2seq`` and ``speech-seq2seq`` (teacher-forced
loss; inference is greedy decoding with the decoder's KV cache over the encoder output once).
Training uses AdamW. Not thread-safe (one thread drives a workload, like every workload).
"""
from __future__ import annotations

import dataclasses
import importlib
from typing import Any, Mapping, Optional

import torch

from hal.models.workload import BaseConfig, Workload

INSTALL_HINT = "pip install 'hal-portability[models]' (or: pip install 'transformers>=4.46,<5')"

_LM = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
           num_key_value_heads=2, max_position_embeddings=128, pad_token_id=0, bos_token_id=1, eos_token_id=2,
           attention_dropout=0.0)
_ENC = dict(vocab_size=256, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
            max_position_embeddings=130, attention_probs_dropout_prob=0.0)
_S2S = dict(vocab_size=256, d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
            decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128, dropout=0.0, attention_dropout=0.0,
            activation_dropout=0.0)


@dataclasses.dataclass(frozen=True)
class Architecture:
    """One real architecture: ``family`` (how the matrix groups it), the ``transformers`` class names,
    the ``task`` (batch, loss and inference path) and the small config's fields."""

    family: str
    config_class: str
    model_class: str
    task: str
    config: Mapping[str, Any]


#: every architecture ``hf:<name>`` offers, in the order reports list them
ARCHITECTURES: dict[str, Architecture] = {
    "llama": Architecture("decoder LLM", "LlamaConfig", "LlamaForCausalLM", "causal-lm", _LM),
    "qwen2": Architecture("decoder LLM", "Qwen2Config", "Qwen2ForCausalLM", "causal-lm", _LM),
    "qwen3": Architecture("decoder LLM", "Qwen3Config", "Qwen3ForCausalLM", "causal-lm", {**_LM, "head_dim": 16}),
    "mistral": Architecture("decoder LLM", "MistralConfig", "MistralForCausalLM", "causal-lm", _LM),
    "gemma": Architecture("decoder LLM", "GemmaConfig", "GemmaForCausalLM", "causal-lm",
                          {**_LM, "num_key_value_heads": 1, "head_dim": 16}),
    "phi3": Architecture("decoder LLM", "Phi3Config", "Phi3ForCausalLM", "causal-lm",
                         {**_LM, "resid_pdrop": 0.0, "embd_pdrop": 0.0}),
    "mixtral": Architecture("MoE LLM", "MixtralConfig", "MixtralForCausalLM", "causal-lm",
                            {**_LM, "num_local_experts": 4, "num_experts_per_tok": 2}),
    "qwen2_moe": Architecture("MoE LLM", "Qwen2MoeConfig", "Qwen2MoeForCausalLM", "causal-lm",
                              {**_LM, "moe_intermediate_size": 32, "shared_expert_intermediate_size": 64,
                               "num_experts": 4, "num_experts_per_tok": 2, "decoder_sparse_step": 1}),
    "deepseek_v3": Architecture("MoE LLM", "DeepseekV3Config", "DeepseekV3ForCausalLM", "causal-lm",
                                {**_LM, "num_key_value_heads": 4, "moe_intermediate_size": 32,
                                 "first_k_dense_replace": 1, "n_routed_experts": 4, "n_shared_experts": 1,
                                 "num_experts_per_tok": 2, "n_group": 1, "topk_group": 1, "q_lora_rank": 32,
                                 "kv_lora_rank": 16, "qk_rope_head_dim": 8, "qk_nope_head_dim": 8,
                                 "v_head_dim": 16, "rope_scaling": None}),
    "bert": Architecture("encoder", "BertConfig", "BertForMaskedLM", "masked-lm", _ENC),
    "roberta": Architecture("encoder", "RobertaConfig", "RobertaForMaskedLM", "masked-lm", {**_ENC, "pad_token_id": 1}),
    "vit": Architecture("vision", "ViTConfig", "ViTForImageClassification", "image-classification",
                        dict(image_size=32, patch_size=8, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                             intermediate_size=128, num_labels=10)),
    "convnext": Architecture("vision", "ConvNextConfig", "ConvNextForImageClassification", "image-classification",
                             dict(hidden_sizes=[16, 32], depths=[1, 1], num_stages=2, patch_size=4, image_size=32,
                                  num_labels=10)),
    "resnet": Architecture("vision", "ResNetConfig", "ResNetForImageClassification", "image-classification",
                           dict(embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1], layer_type="basic",
                                num_labels=10)),
    "clip": Architecture("vision", "CLIPConfig", "CLIPModel", "contrastive",
                         dict(projection_dim=32,
                              text_config=dict(vocab_size=256, hidden_size=64, intermediate_size=128,
                                               num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=32),
                              vision_config=dict(image_size=32, patch_size=8, hidden_size=64, intermediate_size=128,
                                                 num_hidden_layers=2, num_attention_heads=4))),
    "whisper": Architecture("speech", "WhisperConfig", "WhisperForConditionalGeneration", "speech-seq2seq",
                            {**_S2S, "num_mel_bins": 16, "max_source_positions": 32, "max_target_positions": 64,
                             "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2, "decoder_start_token_id": 1,
                             "suppress_tokens": None, "begin_suppress_tokens": None}),
    "wav2vec2": Architecture("speech", "Wav2Vec2Config", "Wav2Vec2ForCTC", "ctc",
                             dict(vocab_size=32, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                  intermediate_size=128, conv_dim=(32, 32, 32), conv_stride=(5, 2, 2),
                                  conv_kernel=(10, 3, 3), num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4,
                                  pad_token_id=0, ctc_loss_reduction="mean", attention_dropout=0.0,
                                  mask_time_prob=0.0, layerdrop=0.0)),
    "t5": Architecture("seq2seq", "T5Config", "T5ForConditionalGeneration", "seq2seq",
                       dict(vocab_size=256, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_decoder_layers=2,
                            num_heads=4, relative_attention_num_buckets=8, decoder_start_token_id=0, pad_token_id=0,
                            eos_token_id=1)),
    "bart": Architecture("seq2seq", "BartConfig", "BartForConditionalGeneration", "seq2seq",
                         {**_S2S, "max_position_embeddings": 64, "pad_token_id": 1, "bos_token_id": 0,
                          "eos_token_id": 2, "decoder_start_token_id": 2, "forced_eos_token_id": None}),
}

#: every ``hf:`` workload name, in the order of ARCHITECTURES (the ``real`` set of ``hal matrix --models``)
HF_NAMES = tuple(f"hf:{a}" for a in ARCHITECTURES)


@dataclasses.dataclass(frozen=True)
class HfConfig(BaseConfig):
    """Batch shape of an ``hf:`` workload (the architecture's own size is in :data:`ARCHITECTURES`)."""

    batch_size: int = 2
    seq_len: int = 16
    new_tokens: int = 4
    image_size: int = 32
    audio_samples: int = 4000
    label_len: int = 8
    lr: float = 1e-3


def transformers_module():
    """``transformers``, imported on first use; ImportError saying how to install it."""
    try:
        return importlib.import_module("transformers")
    except ImportError as exc:
        raise ImportError(f"the hf: models need transformers ({exc}); {INSTALL_HINT}") from None


class HfWorkload(Workload):
    """A ``transformers`` model as a :class:`Workload` (see the module docstring).

    Subclasses are made per architecture by :func:`workload_class` (``name`` ``"hf:<arch>"``,
    ``arch`` the :class:`Architecture`)."""

    arch: Architecture
    CONFIGS = {"tiny": HfConfig()}

    # ---- construction ----------------------------------------------------------------------------
    def model_config(self) -> Any:
        """The ``transformers`` config object of this architecture (nothing allocated)."""
        tf = transformers_module()
        return getattr(tf, self.arch.config_class)(**self.arch.config)

    def _make_model(self) -> torch.nn.Module:
        tf = transformers_module()
        model = getattr(tf, self.arch.model_class)(self.model_config())
        if hasattr(model, "set_experts_implementation") and getattr(model.config, "_experts_implementation", None):
            # transformers 5 runs MoE experts through torch._grouped_mm by default (torch >= 2.9, no float64: the
            # precision reference could not run it); "eager", the loop over experts transformers 4 ran, computes on
            # every backend and dtype
            model.set_experts_implementation("eager")
        if getattr(model, "generation_config", None) is not None:
            model.generation_config.pad_token_id = model.config.pad_token_id
        return model

    def _make_optimizer(self, params: Any) -> torch.optim.Optimizer:
        return torch.optim.AdamW(params, lr=self.config.lr)

    # ---- data ------------------------------------------------------------------------------------
    def _vocab(self) -> int:
        cfg = self.arch.config
        return int(cfg.get("vocab_size") or cfg["text_config"]["vocab_size"])

    def _make_batch(self, batch_size: int, gen: torch.Generator) -> dict[str, torch.Tensor]:
        c, task, b = self.config, self.arch.task, batch_size
        ids = (torch.randint(3, self._vocab(), (b, c.seq_len), generator=gen)
               if task in ("causal-lm", "masked-lm", "contrastive", "seq2seq") else None)
        if task == "causal-lm":
            return {"input_ids": ids, "labels": ids.clone()}
        if task == "masked-lm":
            labels = torch.full_like(ids, -100)
            masked = torch.rand(ids.shape, generator=gen) < 0.25
            masked[:, 0] = True
            labels[masked] = ids[masked]
            return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}
        if task == "image-classification":
            return {"pixel_values": torch.randn(b, 3, c.image_size, c.image_size, generator=gen),
                    "labels": torch.randint(0, self.arch.config["num_labels"], (b,), generator=gen)}
        if task == "contrastive":
            return {"input_ids": ids, "pixel_values": torch.randn(b, 3, c.image_size, c.image_size, generator=gen)}
        if task == "ctc":
            return {"input_values": torch.randn(b, c.audio_samples, generator=gen),
                    "labels": torch.randint(1, self._vocab(), (b, c.label_len), generator=gen)}
        if task == "seq2seq":
            return {"input_ids": ids, "labels": torch.randint(3, self._vocab(), (b, c.label_len), generator=gen)}
        if task == "speech-seq2seq":
            cfg = self.arch.config
            return {"input_features": torch.randn(b, cfg["num_mel_bins"], 2 * cfg["max_source_positions"],
                                                  generator=gen),
                    "labels": torch.randint(3, self._vocab(), (b, c.label_len), generator=gen)}
        raise ValueError(f"unknown task {task!r}")

    # ---- steps -------------------------------------------------------------------------------------
    def _loss_kwargs(self) -> dict:
        """Extra forward arguments that make the model compute its loss (CLIP asks for it)."""
        return {"return_loss": True} if self.arch.task == "contrastive" else {}

    def _loss(self, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        return self.model(**batch, **self._loss_kwargs()).loss

    @torch.no_grad()
    def infer(self, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """Eval mode. Decoders and encoder-decoders: ``new_tokens`` greedy tokens with the KV cache
        (returns them, ``(batch, new_tokens)``); the others: logits (CLIP: image-text logits)."""
        self._require_built()
        self.model.eval()
        task = self.arch.task
        inputs = {k: v for k, v in batch.items() if k != "labels"}
        if task == "causal-lm":
            return self._greedy(inputs, encoder_decoder=False)
        if task in ("seq2seq", "speech-seq2seq"):
            return self._greedy(inputs, encoder_decoder=True)
        out = self.model(**inputs)
        return out.logits_per_image if task == "contrastive" else out.logits

    def _greedy(self, inputs: dict, encoder_decoder: bool) -> torch.Tensor:
        m, n = self.model, self.config.new_tokens
        if encoder_decoder:
            start = m.config.decoder_start_token_id
            b = next(iter(inputs.values())).shape[0]
            step_in = {**inputs, "decoder_input_ids": torch.full((b, 1), start, dtype=torch.long, device=self.device)}
        else:
            step_in = dict(inputs)
        tokens = []
        encoder_outputs = None
        past = None
        for _ in range(n):
            out = m(**step_in, past_key_values=past, use_cache=True,
                    **({"encoder_outputs": encoder_outputs} if encoder_outputs is not None else {}))
            nxt = out.logits[:, -1:].argmax(-1)
            tokens.append(nxt)
            past = out.past_key_values
            if encoder_decoder:
                encoder_outputs = (out.encoder_last_hidden_state,)
                step_in = {"decoder_input_ids": nxt}
            else:
                step_in = {"input_ids": nxt}
        return torch.cat(tokens, dim=1)

    # ---- sizes -------------------------------------------------------------------------------------
    def estimates(self, batch_size: Optional[int] = None, seq_len: Optional[int] = None, mode: str = "train") -> dict:
        """Parameters, FLOPs per step (``torch.utils.flop_counter`` over one forward of the example
        batch on the host, in float32, with a fresh model when this one is not built on the CPU; x3
        for training) and a memory lower bound (parameters, gradients and AdamW's two moments;
        activations not modelled). The model is small by design, so counting costs well under a second."""
        from torch.utils.flop_counter import FlopCounterMode

        from hal.models.estimate import _bytes
        on_host = self.model is not None and self.device is not None and self.device.type == "cpu" \
            and self.dtype == torch.float32
        if on_host:
            model = self.model
        else:
            with torch.random.fork_rng(devices=[]):  # the caller's random stream is left as it was
                model = self._make_model()
        params = sum(p.numel() for p in model.parameters())
        batch = self._make_batch(int(batch_size or self.config.batch_size), torch.Generator().manual_seed(0))
        was_training = model.training
        model.eval()
        with torch.no_grad(), FlopCounterMode(display=False) as fc:
            model(**batch, **self._loss_kwargs())
        model.train(was_training)
        fwd = int(fc.get_total_flops())
        per = params * _bytes(self.dtype)
        mem = ({"parameters": per, "total_bytes": per, "lower_bound": True} if mode == "infer" else
               {"parameters": per, "gradients": per, "optimizer_state": 2 * per, "total_bytes": 4 * per,
                "lower_bound": True})
        return {"parameters": params, "flops_per_step": fwd if mode == "infer" else 3 * fwd, "memory": mem,
                "mode": mode}


_CLASSES: dict[str, type] = {}


def workload_class(name: str) -> type:
    """The :class:`HfWorkload` subclass for ``"hf:<arch>"``; ValueError naming the choices."""
    arch = name[3:] if name.startswith("hf:") else name
    if arch not in ARCHITECTURES:
        raise ValueError(f"unknown hf architecture {name!r}; one of {', '.join(HF_NAMES)}")
    if arch not in _CLASSES:
        _CLASSES[arch] = type(f"Hf_{arch}_Workload", (HfWorkload,),
                              {"name": f"hf:{arch}", "arch": ARCHITECTURES[arch], "__module__": __name__})
    return _CLASSES[arch]
