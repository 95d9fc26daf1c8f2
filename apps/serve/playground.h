// The playground page tmx serve answers GET / with: one self-contained HTML page (no build step,
// no external assets) to type a prompt, set temperature and max tokens, and watch the stream
// arrive from /v1/completions with its tokens/s.
#pragma once

namespace tmx::serve {

extern const char* const kPlaygroundHtml;

}  // namespace tmx::serve
