#include <filesystem>

#include "engine/core/rng.h"
#include "engine/train/trainer.h"

namespace tmx {
namespace fs = std::filesystem;

void Trainer::open_data() {
    const ModelConfig& c = model_->config();
    train_data_ = open_dataset(options_.data_dir, Split::Train);
    val_data_ =
        open_dataset(options_.val_dir.empty() ? options_.data_dir : options_.val_dir, Split::Val);
    for (const TokenDataset* d : {&*train_data_, &*val_data_}) {
        if (static_cast<int64_t>(d->vocab_size()) != c.vocab_size)
            throw Error(d->dir() + ": its tokens use a vocabulary of " +
                        std::to_string(d->vocab_size()) + " but the model's vocab_size is " +
                        std::to_string(c.vocab_size) +
                        " (prepare the data with the model's tokenizer)");
        if (static_cast<int64_t>(d->size()) <= seq_len_)
            throw Error(d->dir() + ": the " + to_string(d->split()) + " split has " +
                        std::to_string(d->size()) + " tokens, fewer than one sequence of " +
                        std::to_string(seq_len_ + 1));
    }
    const std::string& tok_file = train_data_->meta().tokenizer_file;
    const fs::path tok = fs::path(options_.data_dir) / tok_file;
    tokenizer_path_ = !tok_file.empty() && fs::is_regular_file(tok) ? tok.string() : std::string();
}

void Trainer::sample_batch(int64_t step, int64_t micro, std::vector<int32_t>& inputs,
                           std::vector<int32_t>& targets) const {
    const int64_t B = options_.batch_size, T = seq_len_;
    inputs.resize(static_cast<size_t>(B * T));
    targets.resize(static_cast<size_t>(B * T));
    std::vector<int32_t> window(static_cast<size_t>(T + 1));
    const uint64_t span = train_data_->size() - static_cast<uint64_t>(T);
    for (int64_t b = 0; b < B; ++b) {
        Rng rng(stream_seed(options_.seed, "batch/" + std::to_string(step) + "/" +
                                               std::to_string(micro) + "/" + std::to_string(b)));
        train_data_->copy_range(rng.below(span), window.size(), window.data());
        std::copy(window.begin(), window.end() - 1, inputs.begin() + b * T);
        std::copy(window.begin() + 1, window.end(), targets.begin() + b * T);
    }
}

}  // namespace tmx
