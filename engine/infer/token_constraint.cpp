#include "engine/infer/token_constraint.h"

#include <algorithm>
#include <map>
#include <numeric>

namespace tmx {

TokenVocabulary::TokenVocabulary(const Tokenizer& tokenizer) {
    const int32_t n = tokenizer.vocab_size();
    mid_.resize(static_cast<size_t>(n));
    start_.resize(static_cast<size_t>(n));
    control_.resize(static_cast<size_t>(n));
    using Kind = Tokenizer::Kind;
    for (int32_t id = 0; id < n; ++id) {
        const Tokenizer::PieceInfo& pi = tokenizer.info(id);
        const auto i = static_cast<size_t>(id);
        control_[i] = pi.kind == Kind::Control;
        // As StreamDecoder::push appends them.
        if (pi.kind == Kind::Byte) {
            mid_[i] = start_[i] = std::string(1, static_cast<char>(pi.byte));
        } else if (pi.kind == Kind::Bytes) {
            mid_[i] = start_[i] = pi.text;
        } else if (pi.kind == Kind::Normal) {
            mid_[i] = pi.text;
            start_[i] = pi.leading_space ? pi.text.substr(1) : pi.text;
        }
    }
    mid_trie_ = build_trie(mid_);
    start_trie_ = build_trie(start_);
}

bool TokenVocabulary::starts_text(std::span<const int32_t> prompt) const {
    return std::all_of(prompt.begin(), prompt.end(), [&](int32_t id) {
        return id >= 0 && id < size() && control_[static_cast<size_t>(id)];
    });
}

TokenVocabulary::Trie TokenVocabulary::build_trie(const std::vector<std::string>& texts) {
    // Tokens sorted by text: a node's subtree is then a contiguous run, built breadth-first so
    // that each node's children are contiguous.
    std::vector<int32_t> order;
    for (size_t id = 0; id < texts.size(); ++id)
        if (!texts[id].empty()) order.push_back(static_cast<int32_t>(id));
    std::stable_sort(order.begin(), order.end(),
                     [&](int32_t a, int32_t b) { return texts[a] < texts[b]; });
    struct Pending {
        size_t begin, end, depth;  // the run of `order` below the node, and its text's length
    };
    Trie t;
    t.byte.push_back(0);
    // Breadth-first: node ids in the order nodes are queued.
    std::vector<Pending> queue = {{0, order.size(), 0}};
    for (size_t q = 0; q < queue.size(); ++q) {
        const Pending p = queue[q];
        t.first_child.push_back(static_cast<uint32_t>(t.child.size()));
        t.first_token.push_back(static_cast<uint32_t>(t.tokens.size()));
        size_t i = p.begin;
        while (i < p.end && texts[static_cast<size_t>(order[i])].size() == p.depth)
            t.tokens.push_back(order[i++]);
        while (i < p.end) {
            const uint8_t b = static_cast<uint8_t>(texts[static_cast<size_t>(order[i])][p.depth]);
            size_t j = i;
            while (j < p.end &&
                   static_cast<uint8_t>(texts[static_cast<size_t>(order[j])][p.depth]) == b)
                ++j;
            t.child.push_back(static_cast<int32_t>(queue.size()));
            t.byte.push_back(b);
            queue.push_back({i, j, p.depth + 1});
            i = j;
        }
    }
    t.first_child.push_back(static_cast<uint32_t>(t.child.size()));
    t.first_token.push_back(static_cast<uint32_t>(t.tokens.size()));
    return t;
}

// ---- TokenConstraint

TokenConstraint::TokenConstraint(std::shared_ptr<const JsonGrammar> grammar,
                                 std::shared_ptr<const TokenVocabulary> vocabulary,
                                 std::vector<int32_t> end_ids)
    : vocabulary_(std::move(vocabulary)),
      end_ids_(std::move(end_ids)),
      dfa_(std::move(grammar)),
      nothing_(vocabulary_->size()) {}

TokenConstraint::State TokenConstraint::start(std::span<const int32_t> prompt) const {
    return {0, vocabulary_->starts_text(prompt)};
}

const TokenMask& TokenConstraint::allowed(State state) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (state.dfa == JsonDfa::kDead) return nothing_;
    auto& cache = masks_[state.at_start ? 1 : 0];
    const auto s = static_cast<size_t>(state.dfa);
    if (s >= cache.size()) cache.resize(dfa_.size());
    if (!cache[s]) {
        auto mask = std::make_unique<TokenMask>(vocabulary_->size());
        try {
            compute_mask(state, *mask);
        } catch (const Error& e) {
            // The automaton outgrew its limit: no token, and the sequence fails saying why (an
            // exception must not leave the scheduler's parallel draws).
            failure_ = e.what();
            return nothing_;
        }
        cache[s] = std::move(mask);
    }
    return *cache[s];
}

void TokenConstraint::compute_mask(State state, TokenMask& mask) {
    if (dfa_.accepting(state.dfa))
        for (int32_t id : end_ids_)
            if (id >= 0 && id < vocabulary_->size()) mask.insert(id);
    const TokenVocabulary::Trie& t = vocabulary_->trie(state.at_start);
    // Depth first over the trie, each node with the automaton's state after its text.
    std::vector<std::pair<int32_t, int32_t>> stack = {{0, state.dfa}};
    while (!stack.empty()) {
        const auto [node, at] = stack.back();
        stack.pop_back();
        for (uint32_t c = t.first_child[static_cast<size_t>(node)];
             c < t.first_child[static_cast<size_t>(node) + 1]; ++c) {
            const int32_t n = t.child[c];
            const int32_t next = dfa_.next(at, t.byte[static_cast<size_t>(n)]);
            if (next == JsonDfa::kDead) continue;
            for (uint32_t k = t.first_token[static_cast<size_t>(n)];
                 k < t.first_token[static_cast<size_t>(n) + 1]; ++k)
                mask.insert(t.tokens[k]);
            if (t.first_child[static_cast<size_t>(n)] < t.first_child[static_cast<size_t>(n) + 1])
                stack.push_back({n, next});
        }
    }
}

TokenConstraint::State TokenConstraint::advance(State state, int32_t token) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (state.dfa == JsonDfa::kDead || token < 0 || token >= vocabulary_->size())
        return {JsonDfa::kDead, false};
    const std::string& text = vocabulary_->text(token, state.at_start);
    if (text.empty()) return {JsonDfa::kDead, false};
    try {
        return {dfa_.walk(state.dfa, text), false};
    } catch (const Error& e) {
        failure_ = e.what();
        return {JsonDfa::kDead, false};
    }
}

bool TokenConstraint::finished(State state) {
    std::lock_guard<std::mutex> lock(mutex_);
    return state.dfa != JsonDfa::kDead && dfa_.accepting(state.dfa) &&
           !dfa_.can_continue(state.dfa);
}

std::string TokenConstraint::failure() {
    std::lock_guard<std::mutex> lock(mutex_);
    return failure_;
}

size_t TokenConstraint::automaton_states() {
    std::lock_guard<std::mutex> lock(mutex_);
    return dfa_.size();
}

}  // namespace tmx
