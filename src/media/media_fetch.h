#pragma once
// Media parts given as http(s) URLs, fetched only from hosts the operator allows (off by default: an empty list).
//
// What a fetch may do, and why (a server that fetches URLs for its clients must not become their proxy into the
// network it sits in, SSRF):
//   - http and https only; https verifies the certificate against the system store (OpenSSL's default paths:
//     SSL_CERT_FILE / SSL_CERT_DIR add a private CA) and the host name;
//   - the host must match an allowed entry: `a.com` exactly, `*.b.org` any name ending in `.b.org`, `*` any host;
//   - every address the host resolves to (or the IP literal itself) that is not public (loopback, private, link-local
//     such as the cloud metadata address 169.254.169.254, carrier-grade NAT, unique-local, multicast, reserved) is
//     refused unless the host is listed exactly: `*` and `*.b.org` reach public addresses only. The connection goes
//     to the addresses checked, so a second DNS answer cannot swap them;
//   - at most `max_redirects` redirects, each target checked as the first URL;
//   - the whole exchange (resolve, connect, TLS, every redirect, the body) within one deadline;
//   - at most max_bytes of body: a larger Content-Length is refused before the body, a longer body as it streams;
//   - a Content-Type, when sent, of the part's kind (image/* or audio/*), and no Content-Encoding.
#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "media/media_input.h"

namespace qs::media {

struct MediaFetchOptions {
  std::vector<std::string> allowed_hosts;  // lower-case entries (parse_allowed_media_hosts); empty: URLs are refused
  std::chrono::milliseconds timeout{10000};  // the whole fetch, redirects included
  int max_redirects = 3;
  bool enabled() const { return !allowed_hosts.empty(); }
};

// A comma-separated list of host entries (`a.com`, `*.b.org`, `*`, `127.0.0.1`, `::1` or `[::1]`), spaces around
// entries ignored, lower-cased. Throws qs::Error naming the entry that is none of these.
std::vector<std::string> parse_allowed_media_hosts(std::string_view list);

// The bytes at `url` (http or https), under the rules above, as a MediaInput of `kind` whose declared format is the
// Content-Type's subtype (empty when none was sent). Throws qs::Error "<where>: <url>: <reason>" on any refusal or
// failure. Synchronous: blocks the calling thread for at most options.timeout (a DNS lookup that hangs past it holds
// the thread until the system resolver gives up).
MediaInput fetch_media(std::string_view url, MediaKind kind, const MediaFetchOptions& options, int64_t max_bytes,
                       std::string where);

}  // namespace qs::media
