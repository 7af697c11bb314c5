// Tern's window onto llama.cpp's own Jinja chat-template path: the one
// `llama-server --jinja` renders prompts with (common_chat_templates_apply),
// exposed as one C function so Tern's tests can hold its minijinja rendering
// against it. Messages and tools arrive as OpenAI-style JSON text.

#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>

#include "chat.h"

static char * tern_dup(const std::string & s) {
    char * p = static_cast<char *>(std::malloc(s.size() + 1));
    if (p) {
        std::memcpy(p, s.data(), s.size());
        p[s.size()] = '\0';
    }
    return p;
}

// Renders `messages_json` (and `tools_json`, empty for none) through the
// template `tmpl`. Returns 0 with the prompt in *out, or 1 with the error text
// in *out; *out is freed with tern_llama_free.
extern "C" int tern_llama_render_chat(const char * tmpl, const char * bos, const char * eos,
                                      const char * messages_json, const char * tools_json,
                                      int add_generation_prompt, int enable_thinking, char ** out) {
    try {
        auto templates = common_chat_templates_init(nullptr, tmpl, bos, eos);
        common_chat_templates_inputs inputs;
        inputs.messages = common_chat_msgs_parse_oaicompat(common_json::parse(messages_json));
        if (tools_json && tools_json[0] != '\0') {
            inputs.tools = common_chat_tools_parse_oaicompat(common_json::parse(tools_json));
        }
        inputs.add_generation_prompt = add_generation_prompt != 0;
        inputs.use_jinja             = true;
        inputs.enable_thinking       = enable_thinking != 0;
        *out = tern_dup(common_chat_templates_apply(templates.get(), inputs).prompt);
        return 0;
    } catch (const std::exception & e) {
        *out = tern_dup(e.what());
        return 1;
    } catch (...) {
        *out = tern_dup("unknown C++ exception");
        return 1;
    }
}

extern "C" void tern_llama_free(char * p) {
    std::free(p);
}
