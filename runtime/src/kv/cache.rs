//! A sequence's KV cache: per layer, keys (after RoPE) and values of every kept
//! position with their original positions.
//!
//! Storage per layer is one preallocated buffer `[n_kv_head, capacity, head_dim]`
//! f32 for K and one for V, written in place and grown geometrically, so an
//! append costs the new tokens only. Views handed to the model are narrowed
//! slices of the buffer, not copies.

use candle_core::{DType, Device, Tensor};
use tern_models::{KvStore, ModelConfig};

/// Smallest capacity a layer's buffer is allocated with.
const MIN_CAPACITY: usize = 64;

struct LayerKv {
    /// `[n_kv_head, capacity, head_dim]` f32, first `len` positions valid.
    k: Option<Tensor>,
    /// Same shape as `k`.
    v: Option<Tensor>,
    capacity: usize,
    positions: Vec<u32>,
}

/// The cache of one sequence, across all layers.
pub struct SeqCache {
    layers: Vec<LayerKv>,
    n_kv_head: usize,
    head_dim: usize,
    peak_bytes: usize,
}

impl SeqCache {
    /// An empty cache shaped for `config`.
    pub fn new(config: &ModelConfig) -> Self {
        Self {
            layers: (0..config.n_layer)
                .map(|_| LayerKv {
                    k: None,
                    v: None,
                    capacity: 0,
                    positions: Vec::new(),
                })
                .collect(),
            n_kv_head: config.n_kv_head,
            head_dim: config.head_dim,
            peak_bytes: 0,
        }
    }

    /// Positions held by layer 0 (all layers hold the same count without eviction).
    pub fn len(&self) -> usize {
        self.layers.first().map_or(0, |l| l.positions.len())
    }

    /// Whether nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes of keys and values currently held (valid entries, all layers).
    pub fn bytes(&self) -> usize {
        let per_pos = 2 * self.n_kv_head * self.head_dim * std::mem::size_of::<f32>();
        self.layers
            .iter()
            .map(|l| l.positions.len() * per_pos)
            .sum()
    }

    /// The largest [`Self::bytes`] seen since creation.
    pub fn peak_bytes(&self) -> usize {
        self.peak_bytes
    }

    /// A deep copy that evolves independently (best-of-N children share a
    /// prefilled prompt this way).
    pub fn fork(&self) -> candle_core::Result<Self> {
        let copy = |t: &Option<Tensor>| t.as_ref().map(Tensor::copy).transpose();
        Ok(Self {
            layers: self
                .layers
                .iter()
                .map(|l| {
                    Ok(LayerKv {
                        k: copy(&l.k)?,
                        v: copy(&l.v)?,
                        capacity: l.capacity,
                        positions: l.positions.clone(),
                    })
                })
                .collect::<candle_core::Result<_>>()?,
            n_kv_head: self.n_kv_head,
            head_dim: self.head_dim,
            peak_bytes: self.peak_bytes,
        })
    }

    /// Drops every position at or after `len` (e.g. to re-run a prompt suffix).
    pub fn truncate(&mut self, len: usize) {
        for l in &mut self.layers {
            l.positions.truncate(len);
        }
    }

    fn grow(&mut self, layer: usize, needed: usize) -> candle_core::Result<()> {
        let (kvh, hd) = (self.n_kv_head, self.head_dim);
        let l = &mut self.layers[layer];
        if needed <= l.capacity {
            return Ok(());
        }
        let capacity = needed.max(2 * l.capacity).max(MIN_CAPACITY);
        let k = Tensor::zeros((kvh, capacity, hd), DType::F32, &Device::Cpu)?;
        let v = Tensor::zeros((kvh, capacity, hd), DType::F32, &Device::Cpu)?;
        let len = l.positions.len();
        if let (Some(old_k), Some(old_v), true) = (&l.k, &l.v, len > 0) {
            k.slice_set(&old_k.narrow(1, 0, len)?.contiguous()?, 1, 0)?;
            v.slice_set(&old_v.narrow(1, 0, len)?.contiguous()?, 1, 0)?;
        }
        l.k = Some(k);
        l.v = Some(v);
        l.capacity = capacity;
        Ok(())
    }
}

impl KvStore for SeqCache {
    fn append(
        &mut self,
        layer: usize,
        k: &Tensor,
        v: &Tensor,
        positions: &[u32],
    ) -> tern_models::Result<(Tensor, Tensor)> {
        let len = self.layers[layer].positions.len();
        let total = len + positions.len();
        self.grow(layer, total)?;
        let l = &mut self.layers[layer];
        let (kb, vb) = match (&l.k, &l.v) {
            (Some(k), Some(v)) => (k, v),
            // grow() always allocates when total > 0; an empty append needs none.
            _ => {
                let empty =
                    Tensor::zeros((self.n_kv_head, 0, self.head_dim), DType::F32, &Device::Cpu)?;
                return Ok((empty.clone(), empty));
            }
        };
        kb.slice_set(&k.contiguous()?, 1, len)?;
        vb.slice_set(&v.contiguous()?, 1, len)?;
        l.positions.extend_from_slice(positions);
        let views = (kb.narrow(1, 0, total)?, vb.narrow(1, 0, total)?);
        self.peak_bytes = self.peak_bytes.max(self.bytes());
        Ok(views)
    }

    fn positions(&self, layer: usize) -> &[u32] {
        &self.layers[layer].positions
    }
}
