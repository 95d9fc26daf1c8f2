// JsonDfa (json_schema.h): the grammar's automaton determinized lazily.
#include <algorithm>

#include "engine/infer/json_schema.h"

namespace tmx {

JsonDfa::JsonDfa(std::shared_ptr<const JsonGrammar> grammar) : grammar_(std::move(grammar)) {
    mark_.assign(grammar_->states().size(), 0);
    std::vector<int32_t> start = {grammar_->start()};
    intern(start);
}

int32_t JsonDfa::walk(int32_t state, std::string_view bytes) {
    for (char c : bytes) {
        if (state == kDead) return kDead;
        state = next(state, static_cast<uint8_t>(c));
    }
    return state;
}

int32_t JsonDfa::compute_next(int32_t state, uint8_t byte) {
    std::vector<int32_t> targets;
    for (int32_t q : sets_[static_cast<size_t>(state)])
        for (const auto& e : grammar_->states()[static_cast<size_t>(q)].edges)
            if (e.lo <= byte && byte <= e.hi) targets.push_back(e.to);
    const int32_t to = targets.empty() ? kDead : intern(targets);
    table_[static_cast<size_t>(state)][byte] = to;
    return to;
}

int32_t JsonDfa::intern(std::vector<int32_t>& states) {
    // The epsilon closure.
    if (++generation_ == 0) {
        std::fill(mark_.begin(), mark_.end(), 0);
        generation_ = 1;
    }
    std::vector<int32_t> stack;
    std::vector<int32_t> closure;
    for (int32_t q : states)
        if (mark_[static_cast<size_t>(q)] != generation_) {
            mark_[static_cast<size_t>(q)] = generation_;
            stack.push_back(q);
        }
    while (!stack.empty()) {
        const int32_t q = stack.back();
        stack.pop_back();
        closure.push_back(q);
        for (int32_t t : grammar_->states()[static_cast<size_t>(q)].epsilon)
            if (mark_[static_cast<size_t>(t)] != generation_) {
                mark_[static_cast<size_t>(t)] = generation_;
                stack.push_back(t);
            }
    }
    std::sort(closure.begin(), closure.end());
    const auto found = ids_.find(closure);
    if (found != ids_.end()) return found->second;
    if (sets_.size() >= kMaxStates)
        throw Error("the JSON schema's automaton grew beyond " + std::to_string(kMaxStates) +
                    " states");
    uint8_t flags = 0;
    for (int32_t q : closure) {
        if (q == grammar_->accept()) flags |= kAccepting;
        if (!grammar_->states()[static_cast<size_t>(q)].edges.empty()) flags |= kContinues;
    }
    const int32_t id = static_cast<int32_t>(sets_.size());
    ids_.emplace(closure, id);
    sets_.push_back(std::move(closure));
    table_.emplace_back();
    table_.back().fill(kUnknown);
    flags_.push_back(flags);
    return id;
}

}  // namespace tmx
