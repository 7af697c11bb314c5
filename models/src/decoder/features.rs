//! What the architectures built on the decoder switch on or off: each
//! architecture's file declares its [`Features`], the decoder reads them at
//! load and in the forward, and nothing else about an architecture reaches it.

/// How the decoders of the llama family differ, as each architecture's file
/// declares it (llama, qwen2, ...): everything else is shared.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Features {
    /// Biases on the Q, K and V projections (`blk.N.attn_{q,k,v}.bias`).
    pub qkv_bias: bool,
    /// RMSNorm of each query and key head before RoPE
    /// (`blk.N.attn_{q,k}_norm.weight`, `[head_dim]`).
    pub qk_norm: bool,
    /// Which elements RoPE rotates together.
    pub rope: RopeStyle,
    /// Phi-3's storage: Q/K/V may be one `attn_qkv` and gate/up are one
    /// `ffn_up` (`[gate; up]`), split by rows at load (see [`super::fused`]).
    pub fused_projections: bool,
    /// The query multiplied by `1/sqrt(hd)` after RoPE and the scores left
    /// unscaled (Phi-3), rather than the scores scaled (llama).
    pub scale_query: bool,
    /// Which per-pair RoPE frequency factors the file may carry.
    pub rope_factors: RopeFactors,
    /// RMSNorms after attention and after the MLP, before each joins the
    /// residual (`blk.N.post_attention_norm`, `blk.N.post_ffw_norm`: Gemma's).
    pub post_norms: bool,
    /// The MLP's gated activation.
    pub mlp: Mlp,
    /// Token embeddings multiplied by `sqrt(n_embd)` (Gemma).
    pub embed_scale: bool,
}

/// Where a model's per-pair RoPE frequency factors come from, if anywhere.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeFactors {
    /// Llama 3's `rope_freqs.weight`, when present.
    Llama3,
    /// Phi-3's LongRoPE: `rope_factors_long.weight` or
    /// `rope_factors_short.weight`, chosen by context length.
    LongRope,
}

/// The gated activation of the MLP: `act(gate) * up`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mlp {
    /// SiLU (SwiGLU): llama, Qwen.
    Silu,
    /// GELU, tanh approximation (GeGLU): Gemma.
    GeluTanh,
}

/// The pairing RoPE rotates, which llama.cpp calls the rope type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeStyle {
    /// Adjacent pairs `(2i, 2i+1)`: GGUF llama weights are laid out for it.
    Interleaved,
    /// Halves `(i, i + hd/2)`: NeoX's layout (Qwen2, Gemma, Phi-3).
    Neox,
}
