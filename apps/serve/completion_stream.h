// A completion streamed as server-sent events (OpenAI's "stream": true): a "data: {chunk}" event
// for each choice's new text, the usage chunk when asked for, an error event when the
// completion failed or was cancelled, and "data: [DONE]". A client that leaves cancels what is
// still running.
#pragma once

#include <memory>

#include "apps/serve/http_server.h"
#include "apps/serve/metrics.h"
#include "apps/serve/openai_api.h"
#include "engine/infer/completion_session.h"

namespace tmx::serve {

// The response streams the completion; each request's outcome is counted in `metrics`.
void stream_completion(HttpResponse& res, std::shared_ptr<Completion> completion,
                       const ResponseHeader& header, const CompletionRequest& request,
                       Metrics& metrics);

}  // namespace tmx::serve
