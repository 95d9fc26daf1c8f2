// What a run reads: the train split of its dataset and the val split of its validation dataset,
// checked against the model. A step's micro-batches are a pure function of (seed, step,
// micro-batch), so that a resumed run reads what the uninterrupted one would, on any number of
// ranks; an evaluation reads the same windows, from the start of the validation stream, every
// time.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/data/dataset.h"
#include "engine/train/train_options.h"

namespace tmx {

class TrainData {
  public:
    // Opens options.data_dir's train split and the val split of options.val_dir (default:
    // data_dir). A tmx::Error names the dataset whose vocabulary is not vocab_size, or whose
    // split holds fewer tokens than one sequence of seq_len + 1.
    TrainData(const TrainOptions& options, int64_t vocab_size, int64_t seq_len);

    // Micro-batch `micro` of optimizer step `step`: batch_size sequences of seq_len tokens at
    // random places of the train split, and their targets (the next tokens).
    void sample_batch(int64_t step, int64_t micro, std::vector<int32_t>& inputs,
                      std::vector<int32_t>& targets) const;
    // The validation windows an evaluation scores: eval_batches batches of batch_size, or as
    // many consecutive windows as the val split holds.
    int64_t validation_windows() const;
    // Validation windows [first, first + rows): inputs and targets.
    void validation_batch(int64_t first, int64_t rows, std::vector<int32_t>& inputs,
                          std::vector<int32_t>& targets) const;
    // The dataset's tokenizer file, which checkpoints carry; "" when it has none.
    const std::string& tokenizer_path() const { return tokenizer_path_; }

  private:
    TokenDataset train_, val_;
    int64_t batch_size_, seq_len_, eval_batches_;
    uint64_t seed_;
    std::string tokenizer_path_;
};

}  // namespace tmx
