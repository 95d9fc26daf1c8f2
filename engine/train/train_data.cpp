#include "engine/train/train_data.h"

#include <algorithm>
#include <filesystem>

#include "engine/core/errors.h"
#include "engine/core/rng.h"

namespace tmx {
namespace fs = std::filesystem;

TrainData::TrainData(const TrainOptions& options, int64_t vocab_size, int64_t seq_len)
    : train_(open_dataset(options.data_dir, Split::Train)),
      val_(open_dataset(options.val_dir.empty() ? options.data_dir : options.val_dir, Split::Val)),
      batch_size_(options.batch_size),
      seq_len_(seq_len),
      eval_batches_(options.eval_batches),
      seed_(options.seed) {
    for (const TokenDataset* d : {&train_, &val_}) {
        if (static_cast<int64_t>(d->vocab_size()) != vocab_size)
            throw Error(d->dir() + ": its tokens use a vocabulary of " +
                        std::to_string(d->vocab_size()) + " but the model's vocab_size is " +
                        std::to_string(vocab_size) +
                        " (prepare the data with the model's tokenizer)");
        if (static_cast<int64_t>(d->size()) <= seq_len_)
            throw Error(d->dir() + ": the " + to_string(d->split()) + " split has " +
                        std::to_string(d->size()) + " tokens, fewer than one sequence of " +
                        std::to_string(seq_len_ + 1));
    }
    const std::string& tok_file = train_.meta().tokenizer_file;
    const fs::path tok = fs::path(options.data_dir) / tok_file;
    tokenizer_path_ = !tok_file.empty() && fs::is_regular_file(tok) ? tok.string() : std::string();
}

void TrainData::sample_batch(int64_t step, int64_t micro, std::vector<int32_t>& inputs,
                             std::vector<int32_t>& targets) const {
    const int64_t B = batch_size_, T = seq_len_;
    inputs.resize(static_cast<size_t>(B * T));
    targets.resize(static_cast<size_t>(B * T));
    std::vector<int32_t> window(static_cast<size_t>(T + 1));
    const uint64_t span = train_.size() - static_cast<uint64_t>(T);
    for (int64_t b = 0; b < B; ++b) {
        Rng rng(stream_seed(seed_, "batch/" + std::to_string(step) + "/" + std::to_string(micro) +
                                       "/" + std::to_string(b)));
        train_.copy_range(rng.below(span), window.size(), window.data());
        std::copy(window.begin(), window.end() - 1, inputs.begin() + b * T);
        std::copy(window.begin() + 1, window.end(), targets.begin() + b * T);
    }
}

int64_t TrainData::validation_windows() const {
    const int64_t available =
        static_cast<int64_t>((val_.size() - 1) / static_cast<uint64_t>(seq_len_));
    return std::min(eval_batches_ * batch_size_, available);
}

void TrainData::validation_batch(int64_t first, int64_t rows, std::vector<int32_t>& inputs,
                                 std::vector<int32_t>& targets) const {
    const int64_t T = seq_len_;
    std::vector<int32_t> window(static_cast<size_t>(T + 1));
    inputs.resize(static_cast<size_t>(rows * T));
    targets.resize(static_cast<size_t>(rows * T));
    for (int64_t r = 0; r < rows; ++r) {
        val_.copy_range(static_cast<uint64_t>((first + r) * T), window.size(), window.data());
        std::copy(window.begin(), window.end() - 1, inputs.begin() + r * T);
        std::copy(window.begin() + 1, window.end(), targets.begin() + r * T);
    }
}

}  // namespace tmx
