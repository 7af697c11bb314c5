//! ggml's tensor type ids by name, and a walk of a GGUF header's tensor
//! directory that finds the first tensor of a type candle's reader cannot
//! parse, so such a file is refused naming the tensor and its type (an
//! IQ4_XS file says "IQ4_XS", not "unknown dtype 23").

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

impl Reader<'_> {
    fn bytes(&mut self, n: usize) -> Option<&[u8]> {
        let end = self.at.checked_add(n)?;
        let s = self.b.get(self.at..end)?;
        self.at = end;
        Some(s)
    }
    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.bytes(4)?.try_into().ok()?))
    }
    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.bytes(8)?.try_into().ok()?))
    }
    fn string(&mut self) -> Option<&[u8]> {
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

/// The first tensor in a GGUF v2/v3 header whose type candle's reader
/// refuses; `None` when there is none or the header cannot be walked (the
/// reader's own error then stands).
pub fn first_unreadable_tensor(header: &[u8]) -> Option<UnreadableTensor> {
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
        let name = String::from_utf8_lossy(r.string()?).into_owned();
        let dims = r.u32()?;
        if dims > 4 {
            return None;
        }
        r.bytes(8 * dims as usize)?;
        let type_id = r.u32()?;
        r.u64()?;
        if !candle_reads(type_id) {
            return Some(UnreadableTensor { name, type_id });
        }
    }
    None
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
        let h = header(&[("a.weight", 12), ("b.weight", 23), ("c.weight", 20)]);
        let t = first_unreadable_tensor(&h).unwrap();
        assert_eq!(
            t.to_string(),
            "tensor b.weight is IQ4_XS, a type Tern cannot read yet"
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
        let h = header(&[("a.weight", 23)]);
        assert_eq!(first_unreadable_tensor(&h[..h.len() - 20]), None);
        assert_eq!(first_unreadable_tensor(b"GGUF"), None);
    }
}
