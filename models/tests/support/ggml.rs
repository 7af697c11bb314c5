//! ggml's C API (ggml.h, ggml-cpu.h), linked through llama-cpp-sys-2 and
//! called in process: its type ids and traits, its own quantizer, and
//! ggml-cpu's whole MUL_MAT op, the references Tern's kernels are checked
//! against. (The root package's tests include this file too.)

use std::ffi::c_void;

use crate::support::LLAMA_THREADS;

pub const GGML_TYPE_Q2_K: i32 = 10;
pub const GGML_TYPE_Q3_K: i32 = 11;
pub const GGML_TYPE_Q4_K: i32 = 12;
pub const GGML_TYPE_Q5_K: i32 = 13;
pub const GGML_TYPE_Q6_K: i32 = 14;
pub const GGML_TYPE_Q8_K: i32 = 15;
pub const GGML_TYPE_IQ4_NL: i32 = 20;
pub const GGML_TYPE_IQ4_XS: i32 = 23;

pub type FromFloat = unsafe extern "C" fn(*const f32, *mut c_void, i64);
pub type ToFloat = unsafe extern "C" fn(*const c_void, *mut f32, i64);
pub type VecDot =
    unsafe extern "C" fn(i32, *mut f32, usize, *const c_void, usize, *const c_void, usize, i32);

// Mirrors of ggml's structs: every field is there for the layout.
#[allow(dead_code)]
#[repr(C)]
pub struct TypeTraitsCpu {
    pub from_float: Option<FromFloat>,
    pub vec_dot: Option<VecDot>,
    pub vec_dot_type: i32,
    pub nrows: i64,
}

#[allow(dead_code)]
#[repr(C)]
pub struct TypeTraits {
    pub type_name: *const std::ffi::c_char,
    pub blck_size: i64,
    pub blck_size_interleave: i64,
    pub type_size: usize,
    pub is_quantized: bool,
    pub to_float: Option<ToFloat>,
    pub from_float_ref: Option<FromFloat>,
}

#[repr(C)]
struct InitParams {
    mem_size: usize,
    mem_buffer: *mut c_void,
    no_alloc: bool,
}

extern "C" {
    fn ggml_init(params: InitParams) -> *mut c_void;
    fn ggml_free(ctx: *mut c_void);
    fn ggml_new_tensor_2d(ctx: *mut c_void, t: i32, ne0: i64, ne1: i64) -> *mut c_void;
    fn ggml_get_data(t: *const c_void) -> *mut c_void;
    fn ggml_mul_mat(ctx: *mut c_void, a: *mut c_void, b: *mut c_void) -> *mut c_void;
    fn ggml_new_graph(ctx: *mut c_void) -> *mut c_void;
    fn ggml_build_forward_expand(g: *mut c_void, t: *mut c_void);
    fn ggml_graph_compute_with_ctx(ctx: *mut c_void, g: *mut c_void, n_threads: i32) -> i32;
    pub fn ggml_cpu_init();
    fn ggml_get_type_traits_cpu(t: i32) -> *const TypeTraitsCpu;
    pub fn ggml_get_type_traits(t: i32) -> *const TypeTraits;
    fn ggml_quantize_chunk(
        t: i32,
        src: *const f32,
        dst: *mut c_void,
        start: i64,
        nrows: i64,
        n_per_row: i64,
        imatrix: *const f32,
    ) -> usize;
}

/// ggml-cpu's traits of type `t` (its `from_float` and `vec_dot`).
pub fn cpu_traits(t: i32) -> &'static TypeTraitsCpu {
    // SAFETY: ggml_cpu_init is idempotent; the traits are static tables.
    unsafe {
        ggml_cpu_init();
        &*ggml_get_type_traits_cpu(t)
    }
}

/// `rows x cols` f32 quantized by ggml's own quantizer (`ggml_quantize_chunk`).
pub fn ggml_quantize(t: i32, x: &[f32], rows: usize, cols: usize) -> Vec<u8> {
    // SAFETY: the traits are static; the buffer is sized from them.
    let tt = unsafe {
        ggml_cpu_init();
        &*ggml_get_type_traits(t)
    };
    let row_bytes = cols / tt.blck_size as usize * tt.type_size;
    let mut out = vec![0u8; rows * row_bytes];
    // SAFETY: `x` holds rows * cols f32 and `out` the quantized rows.
    let n = unsafe {
        ggml_quantize_chunk(
            t,
            x.as_ptr(),
            out.as_mut_ptr().cast(),
            0,
            rows as i64,
            cols as i64,
            std::ptr::null(),
        )
    };
    assert_eq!(n, out.len());
    out
}

/// ggml-cpu's whole MUL_MAT op (weights in a plain buffer, as every K-quant but
/// a repacked Q4_K is): `x` `[rows, cols]` times the `[n, cols]` weight `raw`.
pub fn ggml_mul_mat_plain(
    t: i32,
    raw: &[u8],
    n: usize,
    cols: usize,
    x: &[f32],
    rows: usize,
) -> Vec<f32> {
    let mem = raw.len() + 4 * (x.len() + rows * n) + (64 << 20);
    // SAFETY: a fresh context big enough for three tensors and the graph (the
    // work buffer is allocated by ggml_graph_compute_with_ctx in it); the data
    // copies match the tensors' sizes.
    unsafe {
        ggml_cpu_init();
        let ctx = ggml_init(InitParams {
            mem_size: mem,
            mem_buffer: std::ptr::null_mut(),
            no_alloc: false,
        });
        assert!(!ctx.is_null());
        let a = ggml_new_tensor_2d(ctx, t, cols as i64, n as i64);
        let b = ggml_new_tensor_2d(ctx, 0, cols as i64, rows as i64);
        std::ptr::copy_nonoverlapping(raw.as_ptr(), ggml_get_data(a).cast::<u8>(), raw.len());
        std::ptr::copy_nonoverlapping(x.as_ptr(), ggml_get_data(b).cast::<f32>(), x.len());
        let c = ggml_mul_mat(ctx, a, b);
        let g = ggml_new_graph(ctx);
        ggml_build_forward_expand(g, c);
        assert_eq!(ggml_graph_compute_with_ctx(ctx, g, LLAMA_THREADS), 0);
        let out = std::slice::from_raw_parts(ggml_get_data(c).cast::<f32>(), rows * n).to_vec();
        ggml_free(ctx);
        out
    }
}
