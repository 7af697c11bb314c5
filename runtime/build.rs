//! With the `llama-cpp` feature, compiles `src/backend/llama_jinja.cpp`: a few
//! lines that call llama.cpp's own Jinja chat-template path, so tests can hold
//! Tern's template rendering against llama.cpp's (`--jinja`) byte for byte.

use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-changed=src/backend/llama_jinja.cpp");
    if std::env::var_os("CARGO_FEATURE_LLAMA_CPP").is_none() {
        return;
    }
    let src = llama_cpp_source();
    cc::Build::new()
        .cpp(true)
        .std("c++17")
        .warnings(false)
        .file("src/backend/llama_jinja.cpp")
        .include(src.join("include"))
        .include(src.join("common"))
        .include(src.join("ggml/include"))
        .include(src.join("vendor"))
        .compile("tern_llama_jinja");
}

/// The llama.cpp source tree llama-cpp-sys-2 built. It exports the CMake
/// package directory of its install (`DEP_LLAMA_GGML_CMAKE_DIR`, in its
/// `OUT_DIR/lib/cmake`); the CMake cache of that build names the source.
fn llama_cpp_source() -> PathBuf {
    let cmake_dir = std::env::var("DEP_LLAMA_GGML_CMAKE_DIR")
        .expect("llama-cpp-sys-2 did not export DEP_LLAMA_GGML_CMAKE_DIR");
    let out_dir = PathBuf::from(cmake_dir)
        .ancestors()
        .nth(2)
        .expect("OUT_DIR above lib/cmake")
        .to_path_buf();
    let cache = std::fs::read_to_string(out_dir.join("build/CMakeCache.txt"))
        .expect("llama-cpp-sys-2's CMakeCache.txt");
    let home = cache
        .lines()
        .find_map(|l| l.strip_prefix("CMAKE_HOME_DIRECTORY:INTERNAL="))
        .expect("CMAKE_HOME_DIRECTORY in the CMake cache");
    PathBuf::from(home)
}
