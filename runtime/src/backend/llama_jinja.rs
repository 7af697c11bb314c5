//! llama.cpp's own Jinja chat-template rendering (the `--jinja` path of
//! llama-server and llama-cli), called in process. Tern renders templates
//! with minijinja ([`crate::chat`]); this is the reference that rendering is
//! held against, message for message, tools and thinking included.

use std::ffi::{c_char, c_int, CStr, CString};

use serde_json::Value;

use crate::error::{Result, RuntimeError};

extern "C" {
    fn tern_llama_render_chat(
        tmpl: *const c_char,
        bos: *const c_char,
        eos: *const c_char,
        messages_json: *const c_char,
        tools_json: *const c_char,
        add_generation_prompt: c_int,
        enable_thinking: c_int,
        out: *mut *mut c_char,
    ) -> c_int;
    fn tern_llama_free(p: *mut c_char);
}

/// What a render is asked for besides the messages.
#[derive(Debug, Clone, Default)]
pub struct JinjaRequest<'a> {
    /// OpenAI-style tool definitions (`[{"type": "function", "function": {...}}]`).
    pub tools: Option<&'a Value>,
    /// End with the header of an assistant turn.
    pub add_generation_prompt: bool,
    /// Whether a thinking model may think (Qwen3's `enable_thinking`).
    pub enable_thinking: bool,
}

/// Renders OpenAI-style `messages` (a JSON array) with the template `source`
/// exactly as llama.cpp's Jinja path does.
pub fn render_chat_llama_cpp(
    source: &str,
    bos_token: &str,
    eos_token: &str,
    messages: &Value,
    req: &JinjaRequest<'_>,
) -> Result<String> {
    let c = |s: &str| {
        CString::new(s).map_err(|_| RuntimeError::Template("text contains a NUL byte".into()))
    };
    let tmpl = c(source)?;
    let bos = c(bos_token)?;
    let eos = c(eos_token)?;
    let messages = c(&messages.to_string())?;
    let tools = c(&req.tools.map(Value::to_string).unwrap_or_default())?;
    let mut out: *mut c_char = std::ptr::null_mut();
    // SAFETY: every pointer is a live NUL-terminated string; the shim writes a
    // malloc'ed string to `out` (or leaves it null on allocation failure),
    // which is read once and freed by the shim's own free.
    let (rc, text) = unsafe {
        let rc = tern_llama_render_chat(
            tmpl.as_ptr(),
            bos.as_ptr(),
            eos.as_ptr(),
            messages.as_ptr(),
            tools.as_ptr(),
            c_int::from(req.add_generation_prompt),
            c_int::from(req.enable_thinking),
            &mut out,
        );
        if out.is_null() {
            return Err(RuntimeError::Template(
                "llama.cpp render: out of memory".into(),
            ));
        }
        let text = CStr::from_ptr(out).to_string_lossy().into_owned();
        tern_llama_free(out);
        (rc, text)
    };
    if rc == 0 {
        Ok(text)
    } else {
        Err(RuntimeError::Template(format!(
            "llama.cpp render failed: {text}"
        )))
    }
}
