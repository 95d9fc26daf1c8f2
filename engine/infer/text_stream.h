// A sequence's text as its tokens arrive: decoded incrementally (a UTF-8 character split
// across tokens appears once whole), cut at the first stop string, and holding back a tail that
// might still become one, so that text handed out is final. Used by the generator and the server.
#pragma once

#include <string>
#include <vector>

#include "engine/data/tokenizer.h"

namespace tmx {

class TextStream {
  public:
    TextStream(const Tokenizer& tok, const std::vector<int32_t>& prompt_ids,
               const std::vector<std::string>& stop)
        : decoder_(tok), stop_(stop) {
        // Decoding the prompt first puts the decoder mid-text, so the continuation keeps the
        // leading space of its first piece.
        for (int32_t id : prompt_ids) decoder_.push(id);
    }

    // Adds a token; returns true when the text now contains a stop string.
    bool push(int32_t id) {
        const size_t old_size = text_.size();
        decoder_.push(id, text_);
        return find_stop(old_size);
    }
    // Text that can no longer change, not yet taken.
    std::string take_final() {
        const size_t end = stopped_ ? text_.size() : text_.size() - held_tail();
        std::string out = text_.substr(emitted_, end - emitted_);
        emitted_ = end;
        return out;
    }
    // At the end of generation: everything not yet taken, held bytes and tail included.
    std::string finish() {
        if (!stopped_) {
            const size_t old_size = text_.size();
            text_ += decoder_.flush();
            find_stop(old_size);
        }
        std::string out = text_.substr(std::min(emitted_, text_.size()));
        emitted_ = text_.size();
        return out;
    }
    const std::string& text() const { return text_; }

  private:
    // Looks for stop strings that end in the text added after old_size; cuts the text at the
    // earliest one.
    bool find_stop(size_t old_size) {
        size_t cut = std::string::npos;
        for (const std::string& s : stop_) {
            if (s.empty()) continue;
            const size_t from = old_size >= s.size() ? old_size - s.size() + 1 : 0;
            cut = std::min(cut, text_.find(s, from));
        }
        if (cut != std::string::npos) {
            text_.resize(cut);
            stopped_ = true;
        }
        return stopped_;
    }
    // The longest suffix of the text that is a proper prefix of a stop string.
    size_t held_tail() const {
        size_t held = 0;
        for (const std::string& s : stop_)
            for (size_t n = std::min(s.size() - (s.empty() ? 0 : 1), text_.size()); n > held; --n)
                if (text_.compare(text_.size() - n, n, s, 0, n) == 0) {
                    held = n;
                    break;
                }
        return std::min(held, text_.size() - emitted_);
    }

    StreamDecoder decoder_;
    std::vector<std::string> stop_;
    std::string text_;
    size_t emitted_ = 0;
    bool stopped_ = false;
};

}  // namespace tmx
