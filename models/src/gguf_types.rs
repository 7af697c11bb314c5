//! ggml's tensor type ids by name, and a walk of a GGUF header's tensor
//! directory. The walk serves two ends: it names the first tensor of a type
//! neither candle's reader nor Tern can read (an IQ2_XXS file says "IQ2_XXS",
//! not "unknown dtype 16"), and it lists the tensors of the types Tern reads
//! past candle ([`OwnType`]: IQ4_NL, IQ4_XS), whose type fields the loader
//! masks before handing the header to candle's metadata reader.

/// ggml's name for tensor type `id` (ggml.h's `ggml_type`), or `None` for an
/// id ggml does not define.
pub fn ggml_type_name(id: u32) -> Option<&'static str> {
    Some(match id {
        0 => "F32",
        1 => "F16",
        2 => "Q4_0",
        3 => "Q4_1",
        6 => "Q5_0",
        7 => "Q5_1",
        8 => "Q8_0",
        9 => "Q8_1",
        10 => "Q2_K",
        11 => "Q3_K",
        12 => "Q4_K",
        13 => "Q5_K",
        14 => "Q6_K",
        15 => "Q8_K",
        16 => "IQ2_XXS",
        17 => "IQ2_XS",
        18 => "IQ3_XXS",
        19 => "IQ1_S",
        20 => "IQ4_NL",
        21 => "IQ3_S",
        22 => "IQ2_S",
        23 => "IQ4_XS",
        24 => "I8",
        25 => "I16",
        26 => "I32",
        27 => "I64",
        28 => "F64",
        29 => "IQ1_M",
        30 => "BF16",
        34 => "TQ1_0",
        35 => "TQ2_0",
        39 => "MXFP4",
        _ => return None,
    })
}

/// Whether candle 0.11's GGUF reader parses tensors of type `id`.
fn candle_reads(id: u32) -> bool {
    matches!(id, 0..=3 | 6..=15 | 30)
}

/// A tensor type candle's `GgmlDType` lacks and Tern reads from the file's
/// bytes itself (see `quant::iq4`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OwnType {
    /// ggml type 20: 32 values per block, an f16 scale and 4-bit indices into
    /// a fixed non-linear table.
    Iq4Nl,
    /// ggml type 23: 256-value super-blocks of eight 32-value sub-blocks with
    /// 6-bit scales, values from IQ4_NL's table.
    Iq4Xs,
}

impl OwnType {
    /// The type for ggml type id `id`, if Tern reads it itself.
    pub fn from_id(id: u32) -> Option<Self> {
        match id {
            20 => Some(Self::Iq4Nl),
            23 => Some(Self::Iq4Xs),
            _ => None,
        }
    }

    /// ggml's type id.
    pub const fn id(self) -> u32 {
        match self {
            Self::Iq4Nl => 20,
            Self::Iq4Xs => 23,
        }
    }

    /// ggml's name for the type.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Iq4Nl => "IQ4_NL",
            Self::Iq4Xs => "IQ4_XS",
        }
    }

    /// Values per block.
    pub const fn block_values(self) -> usize {
        match self {
            Self::Iq4Nl => 32,
            Self::Iq4Xs => 256,
        }
    }

    /// Bytes per block.
    pub const fn block_bytes(self) -> usize {
        match self {
            Self::Iq4Nl => 18,
            Self::Iq4Xs => 136,
        }
    }
}

/// One directory entry of a tensor whose type is an [`OwnType`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnTensor {
    /// The tensor's name.
    pub name: String,
    /// Its type.
    pub ty: OwnType,
    /// Its shape, row-major (GGUF's order reversed, as candle's shapes).
    pub dims: Vec<usize>,
    /// Its data's offset from the start of the tensor data section.
    pub offset: u64,
    /// Where the type field sits in the header.
    pub type_field_at: usize,
}

/// What [`own_tensors`] finds in a header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnDirectory {
    /// The tensors of the types Tern reads itself, in directory order.
    pub tensors: Vec<OwnTensor>,
    /// Bytes from the file's start to the end of the tensor directory.
    pub header_len: usize,
}

/// The tensors of [`OwnType`]s in a GGUF v2/v3 header; `None` when the header
/// cannot be walked (candle's reader then reports it).
pub fn own_tensors(header: &[u8]) -> Option<OwnDirectory> {
    let mut tensors = Vec::new();
    let header_len = walk(header, |name, dims, type_id, offset, at| {
        if let Some(ty) = OwnType::from_id(type_id) {
            let mut dims: Vec<usize> = dims.iter().map(|&d| d as usize).collect();
            dims.reverse();
            tensors.push(OwnTensor {
                name: String::from_utf8_lossy(name).into_owned(),
                ty,
                dims,
                offset,
                type_field_at: at,
            });
        }
        true
    })?;
    Some(OwnDirectory {
        tensors,
        header_len,
    })
}

/// A tensor whose type candle's reader refuses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnreadableTensor {
    /// The tensor's name.
    pub name: String,
    /// Its ggml type id.
    pub type_id: u32,
}

impl std::fmt::Display for UnreadableTensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match ggml_type_name(self.type_id) {
            Some(t) => write!(
                f,
                "tensor {} is {t}, a type Tern cannot read yet",
                self.name
            ),
            None => write!(
                f,
                "tensor {} has ggml type id {}, which ggml does not define (a newer or corrupt file)",
                self.name, self.type_id
            ),
        }
    }
}

/// A little-endian reader over the header bytes; every read is bounds-checked.
struct Reader<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn bytes(&mut self, n: usize) -> Option<&'a [u8]> {
        let end = self.at.checked_add(n)?;
        let b: &'a [u8] = self.b;
        let s = b.get(self.at..end)?;
        self.at = end;
        Some(s)
    }
    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.bytes(4)?.try_into().ok()?))
    }
    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.bytes(8)?.try_into().ok()?))
    }
    fn string(&mut self) -> Option<&'a [u8]> {
        let n = usize::try_from(self.u64()?).ok()?;
        self.bytes(n)
    }
    /// Skips one metadata value of GGUF value type `t`.
    fn skip_value(&mut self, t: u32, depth: usize) -> Option<()> {
        match t {
            0 | 1 | 7 => self.bytes(1).map(drop),
            2 | 3 => self.bytes(2).map(drop),
            4..=6 => self.bytes(4).map(drop),
            10..=12 => self.bytes(8).map(drop),
            8 => self.string().map(drop),
            9 if depth < 4 => {
                let inner = self.u32()?;
                let n = self.u64()?;
                for _ in 0..n {
                    self.skip_value(inner, depth + 1)?;
                }
                Some(())
            }
            _ => None,
        }
    }
}

/// Walks a GGUF v2/v3 header, calling `f(name, dims, type_id, offset,
/// type_field_at)` per tensor until it returns false; the header's length
/// (to the end of the tensor directory), or `None` if it cannot be walked.
fn walk(header: &[u8], mut f: impl FnMut(&[u8], &[u64], u32, u64, usize) -> bool) -> Option<usize> {
    let mut r = Reader { b: header, at: 0 };
    if r.bytes(4)? != b"GGUF" || !(2..=3).contains(&r.u32()?) {
        return None;
    }
    let (tensors, kvs) = (r.u64()?, r.u64()?);
    for _ in 0..kvs {
        r.string()?;
        let t = r.u32()?;
        r.skip_value(t, 0)?;
    }
    for _ in 0..tensors {
        let name = r.string()?;
        let n_dims = r.u32()?;
        if n_dims > 4 {
            return None;
        }
        let mut dims = [0u64; 4];
        for d in dims.iter_mut().take(n_dims as usize) {
            *d = r.u64()?;
        }
        let at = r.at;
        let type_id = r.u32()?;
        let offset = r.u64()?;
        if !f(name, &dims[..n_dims as usize], type_id, offset, at) {
            return Some(r.at);
        }
    }
    Some(r.at)
}

/// The first tensor in a GGUF v2/v3 header whose type neither candle's reader
/// nor Tern ([`OwnType`]) reads; `None` when there is none or the header
/// cannot be walked (the reader's own error then stands).
pub fn first_unreadable_tensor(header: &[u8]) -> Option<UnreadableTensor> {
    let mut found = None;
    walk(header, |name, _, type_id, _, _| {
        if candle_reads(type_id) || OwnType::from_id(type_id).is_some() {
            return true;
        }
        found = Some(UnreadableTensor {
            name: String::from_utf8_lossy(name).into_owned(),
            type_id,
        });
        false
    })?;
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A GGUF v3 header: one string key, one array key, then tensors.
    fn header(tensors: &[(&str, u32)]) -> Vec<u8> {
        let mut b = b"GGUF".to_vec();
        b.extend(3u32.to_le_bytes());
        b.extend((tensors.len() as u64).to_le_bytes());
        b.extend(2u64.to_le_bytes());
        let string = |b: &mut Vec<u8>, s: &str| {
            b.extend((s.len() as u64).to_le_bytes());
            b.extend(s.as_bytes());
        };
        string(&mut b, "general.architecture");
        b.extend(8u32.to_le_bytes());
        string(&mut b, "llama");
        string(&mut b, "tokenizer.ggml.scores");
        b.extend(9u32.to_le_bytes());
        b.extend(6u32.to_le_bytes());
        b.extend(3u64.to_le_bytes());
        b.extend([0u8; 12]);
        for (name, t) in tensors {
            string(&mut b, name);
            b.extend(2u32.to_le_bytes());
            b.extend(256u64.to_le_bytes());
            b.extend(4u64.to_le_bytes());
            b.extend(t.to_le_bytes());
            b.extend(0u64.to_le_bytes());
        }
        b
    }

    #[test]
    fn names_the_first_tensor_of_an_unreadable_type() {
        let h = header(&[("a.weight", 23), ("b.weight", 16), ("c.weight", 20)]);
        let t = first_unreadable_tensor(&h).unwrap();
        assert_eq!(
            t.to_string(),
            "tensor b.weight is IQ2_XXS, a type Tern cannot read yet"
        );
        let h = header(&[("a.weight", 99)]);
        assert!(first_unreadable_tensor(&h)
            .unwrap()
            .to_string()
            .contains("ggml type id 99, which ggml does not define"));
    }

    #[test]
    fn readable_files_and_broken_headers_give_none() {
        assert_eq!(
            first_unreadable_tensor(&header(&[("a", 0), ("b", 14), ("c", 30)])),
            None
        );
        let h = header(&[("a.weight", 16)]);
        assert_eq!(first_unreadable_tensor(&h[..h.len() - 20]), None);
        assert_eq!(first_unreadable_tensor(b"GGUF"), None);
    }

    #[test]
    fn lists_the_iq4_tensors_with_their_type_fields() {
        let h = header(&[("a", 0), ("b.weight", 20), ("c.weight", 23)]);
        let dir = own_tensors(&h).unwrap();
        assert_eq!(dir.header_len, h.len());
        let got: Vec<_> = dir
            .tensors
            .iter()
            .map(|t| (t.name.as_str(), t.ty))
            .collect();
        assert_eq!(
            got,
            [("b.weight", OwnType::Iq4Nl), ("c.weight", OwnType::Iq4Xs)]
        );
        for t in &dir.tensors {
            assert_eq!(t.dims, [4, 256]);
            let at = t.type_field_at;
            assert_eq!(
                u32::from_le_bytes(h[at..at + 4].try_into().unwrap()),
                t.ty.id()
            );
        }
        assert_eq!(own_tensors(&h[..h.len() - 3]), None);
    }
}
