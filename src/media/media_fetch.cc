#include "media/media_fetch.h"

#include <fmt/format.h>
#include <openssl/ssl.h>

#include <algorithm>
#include <array>
#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>
#include <optional>

#include "util/error.h"
#include "util/function_ref.h"

namespace qs::media {

namespace {

namespace asio = boost::asio;
namespace http = boost::beast::http;
using tcp = asio::ip::tcp;
using Clock = std::chrono::steady_clock;
using boost::system::error_code;

constexpr uint32_t kMaxHeaderBytes = 16 << 10;
constexpr size_t kShownUrlChars = 200;  // longer URLs are cut in messages

struct Url {
  bool https = false;
  std::string host;  // lower-case; an IPv6 literal without its brackets
  uint16_t port = 0;
  std::string target;  // path and query ("/" at least), without the fragment

  std::string text() const {
    const bool v6 = host.find(':') != std::string::npos;
    const bool default_port = port == (https ? 443 : 80);
    return fmt::format("{}://{}{}{}{}{}", https ? "https" : "http", v6 ? "[" : "", host, v6 ? "]" : "",
                       default_port ? "" : ":" + std::to_string(port), target);
  }
};

std::string shown(std::string_view url) {
  return url.size() <= kShownUrlChars ? std::string(url) : fmt::format("{}...", url.substr(0, kShownUrlChars));
}

std::optional<asio::ip::address> ip_literal(const std::string& host) {
  error_code ec;
  asio::ip::address a = asio::ip::make_address(host, ec);
  if (ec) return std::nullopt;
  return a;
}

bool is_host_name(std::string_view host) {
  if (host.empty() || host.front() == '.' || host.front() == '-') return false;
  for (char c : host)
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '.' || c == '_')) return false;
  return true;
}

// An absolute http(s) URL. Refuses credentials (never sent on a client's behalf), non-ASCII host names (punycode
// is the wire form) and spaces or control characters anywhere (they would split the request line).
Url parse_url(std::string_view text) {
  for (char c : text)
    if (static_cast<unsigned char>(c) <= 0x20 || c == 0x7f) throw Error("the URL holds a space or control character");
  const size_t sep = text.find("://");
  if (sep == std::string_view::npos) throw Error("not an absolute http(s) URL");
  const std::string scheme = ascii_lower(text.substr(0, sep));
  if (scheme != "http" && scheme != "https")
    throw Error(fmt::format("the scheme '{}' is not fetched (http and https only)", scheme));
  Url url;
  url.https = scheme == "https";
  std::string_view rest = text.substr(sep + 3);
  const size_t authority_end = rest.find_first_of("/?#");
  const std::string_view authority = rest.substr(0, authority_end);
  std::string_view tail = authority_end == std::string_view::npos ? "" : rest.substr(authority_end);
  if (authority.find('@') != std::string_view::npos) throw Error("URLs with credentials (user@host) are not fetched");
  std::string_view host = authority, port;
  bool has_port = false;
  if (authority.starts_with('[')) {
    const size_t close = authority.find(']');
    if (close == std::string_view::npos) throw Error("the IPv6 address has no closing ']'");
    host = authority.substr(1, close - 1);
    std::string_view after = authority.substr(close + 1);
    if (!after.empty() && after.front() != ':') throw Error("unexpected characters after the IPv6 address");
    has_port = !after.empty();
    if (has_port) port = after.substr(1);
  } else if (const size_t colon = authority.rfind(':'); colon != std::string_view::npos) {
    host = authority.substr(0, colon);
    port = authority.substr(colon + 1);
    has_port = true;
  }
  url.host = ascii_lower(host);
  const bool bracketed = authority.starts_with('[');
  if (bracketed ? !(ip_literal(url.host) && ip_literal(url.host)->is_v6()) : !is_host_name(url.host))
    throw Error(fmt::format("'{}' is not a host name or IP address (non-ASCII names are written in punycode)", host));
  url.port = url.https ? 443 : 80;
  if (has_port && !port.empty()) {
    int value = 0;
    for (char c : port) {
      if (c < '0' || c > '9' || value > 65535) throw Error(fmt::format("the port '{}' is not a number", port));
      value = value * 10 + (c - '0');
    }
    if (value < 1 || value > 65535) throw Error(fmt::format("the port {} is not in 1..65535", port));
    url.port = static_cast<uint16_t>(value);
  }
  tail = tail.substr(0, tail.find('#'));
  url.target = tail.starts_with('/') ? std::string(tail) : "/" + std::string(tail);
  return url;
}

// A redirect's Location: absolute, scheme-relative (//host/...), absolute path or relative to the current path.
Url redirect_target(const Url& from, std::string_view location) {
  if (location.find("://") != std::string_view::npos) return parse_url(location);
  if (location.starts_with("//")) return parse_url(fmt::format("{}:{}", from.https ? "https" : "http", location));
  Url base = from;
  if (location.starts_with('/')) {
    base.target = "";
  } else {
    base.target = from.target.substr(0, from.target.find('?'));
    base.target.erase(base.target.rfind('/') + 1);
  }
  return parse_url(base.text() + std::string(location));
}

// Why `a` is not a public address, or nullptr when it is.
const char* non_public_kind(const asio::ip::address& a) {
  if (a.is_v6()) {
    const asio::ip::address_v6 v6 = a.to_v6();
    if (v6.is_v4_mapped()) return non_public_kind(asio::ip::make_address_v4(asio::ip::v4_mapped, v6));
    const asio::ip::address_v6::bytes_type b = v6.to_bytes();
    if (v6.is_loopback()) return "loopback";
    if (v6.is_unspecified()) return "unspecified";
    if ((b[0] & 0xfe) == 0xfc) return "unique-local";
    if (b[0] == 0xfe && (b[1] & 0xc0) == 0x80) return "link-local";
    if (b[0] == 0xfe && (b[1] & 0xc0) == 0xc0) return "site-local";
    if (b[0] == 0xff) return "multicast";
    return nullptr;
  }
  struct Range {
    uint32_t base;
    int bits;
    const char* kind;
  };
  static constexpr std::array<Range, 11> ranges{{
      {0x00000000, 8, "unspecified"},   // 0.0.0.0/8, "this network"
      {0x0a000000, 8, "private"},       // 10/8
      {0x64400000, 10, "carrier-grade NAT"},  // 100.64/10
      {0x7f000000, 8, "loopback"},      // 127/8
      {0xa9fe0000, 16, "link-local"},   // 169.254/16, cloud metadata services
      {0xac100000, 12, "private"},      // 172.16/12
      {0xc0000000, 24, "IETF protocol"},  // 192.0.0/24
      {0xc0a80000, 16, "private"},      // 192.168/16
      {0xc6120000, 15, "benchmarking"},  // 198.18/15
      {0xe0000000, 4, "multicast"},     // 224/4
      {0xf0000000, 4, "reserved"},      // 240/4, broadcast included
  }};
  const uint32_t v = a.to_v4().to_uint();
  for (const Range& r : ranges)
    if ((v >> (32 - r.bits)) == (r.base >> (32 - r.bits))) return r.kind;
  return nullptr;
}

bool listed_exactly(const std::string& host, const MediaFetchOptions& options) {
  return std::find(options.allowed_hosts.begin(), options.allowed_hosts.end(), host) != options.allowed_hosts.end();
}

bool host_allowed(const std::string& host, const MediaFetchOptions& options) {
  for (const std::string& entry : options.allowed_hosts) {
    if (entry == host || entry == "*") return true;
    if (entry.starts_with("*.") && host.ends_with(entry.substr(1)) && !ip_literal(host)) return true;
  }
  return false;
}

struct Timeout {};

// A response read up to its body: a redirect's Location, or the body of a 200.
struct Reply {
  std::optional<std::string> location;
  std::string content_type, body;
};

// One fetch: its I/O context, deadline and limits. Each step starts one asynchronous operation and runs the context
// until that operation's handler has run or the deadline passed (then the operation is cancelled and Timeout thrown:
// its handler is never run, the context being destroyed before it is run again).
class Fetch {
 public:
  Fetch(MediaKind kind, const MediaFetchOptions& options, int64_t max_bytes)
      : kind_(kind), options_(options), max_bytes_(max_bytes), deadline_(Clock::now() + options.timeout) {}

  std::string get(Url url, std::string& content_type) {
    require_allowed_host(url);
    for (int redirects = 0;; ++redirects) {
      Reply reply = exchange(url);
      if (!reply.location) {
        content_type = std::move(reply.content_type);
        return std::move(reply.body);
      }
      if (redirects == options_.max_redirects)
        throw Error(fmt::format("more than {} redirects (the last to {})", options_.max_redirects, shown(*reply.location)));
      try {
        url = redirect_target(url, *reply.location);
        require_allowed_host(url);
      } catch (const Error& e) {
        throw Error(fmt::format("redirected to {}: {}", shown(*reply.location), e.what()));
      }
    }
  }

 private:
  void require_allowed_host(const Url& url) const {
    if (!host_allowed(url.host, options_))
      throw Error(fmt::format("the host '{}' is not one this server fetches media from", url.host));
  }

  void wait(const bool& done, FunctionRef<void()> cancel) {
    io_.restart();
    while (!done)
      if (io_.run_one_until(deadline_) == 0) break;
    if (done) return;
    cancel();
    throw Timeout{};
  }

  // Resolves the host, refuses it when any of its addresses is non-public unless it is listed exactly, and connects
  // to the addresses checked (the first that answers).
  void connect(tcp::socket& socket, const Url& url) {
    tcp::resolver resolver(io_);
    bool done = false;
    error_code ec;
    tcp::resolver::results_type results;
    resolver.async_resolve(url.host, std::to_string(url.port), [&](error_code e, tcp::resolver::results_type r) {
      ec = e, results = std::move(r), done = true;
    });
    wait(done, [&] { resolver.cancel(); });
    if (ec) throw Error(fmt::format("the host '{}' could not be resolved ({})", url.host, ec.message()));
    std::vector<tcp::endpoint> reachable;
    for (const auto& entry : results) {
      const asio::ip::address address = entry.endpoint().address();
      if (const char* kind = non_public_kind(address); kind && !listed_exactly(url.host, options_)) {
        const std::string shown_address = address.to_string() == url.host ? "" : " (" + address.to_string() + ")";
        throw Error(fmt::format("{}{} is a non-public address ({}): only a host the server lists exactly (not "
                                "through a '*' entry) may be fetched from it",
                                url.host, shown_address, kind));
      }
      reachable.push_back(entry.endpoint());
    }
    done = false;
    asio::async_connect(socket, reachable, [&](error_code e, const tcp::endpoint&) { ec = e, done = true; });
    wait(done, [&] { socket.close(); });
    if (ec) throw Error(fmt::format("could not connect to {}:{} ({})", url.host, url.port, ec.message()));
  }

  Reply exchange(const Url& url) {
    tcp::socket socket(io_);
    connect(socket, url);
    auto cancel = [&] { socket.close(); };
    if (!url.https) return request(socket, url, cancel);
    asio::ssl::context tls_context(asio::ssl::context::tls_client);
    tls_context.set_default_verify_paths();
    tls_context.set_verify_mode(asio::ssl::verify_peer);
    asio::ssl::stream<tcp::socket&> tls(socket, tls_context);
    tls.set_verify_callback(asio::ssl::host_name_verification(url.host));
    if (!ip_literal(url.host)) SSL_set_tlsext_host_name(tls.native_handle(), url.host.c_str());  // SNI
    bool done = false;
    error_code ec;
    tls.async_handshake(asio::ssl::stream_base::client, [&](error_code e) { ec = e, done = true; });
    wait(done, cancel);
    if (ec) throw Error(fmt::format("the TLS handshake with {} failed ({})", url.host, ec.message()));
    return request(tls, url, cancel);
  }

  template <class Stream>
  Reply request(Stream& stream, const Url& url, FunctionRef<void()> cancel) {
    http::request<http::empty_body> req{http::verb::get, url.target, 11};
    const bool default_port = url.port == (url.https ? 443 : 80);
    const bool v6 = url.host.find(':') != std::string::npos;
    req.set(http::field::host, fmt::format("{}{}{}{}", v6 ? "[" : "", url.host, v6 ? "]" : "",
                                           default_port ? "" : ":" + std::to_string(url.port)));
    req.set(http::field::user_agent, "qatserve");
    req.set(http::field::accept, fmt::format("{}/*", media_kind_name(kind_)));
    req.set(http::field::connection, "close");
    bool done = false;
    error_code ec;
    http::async_write(stream, req, [&](error_code e, size_t) { ec = e, done = true; });
    wait(done, cancel);
    if (ec) throw Error(fmt::format("sending the request failed ({})", ec.message()));

    boost::beast::flat_buffer buffer;
    http::response_parser<http::string_body> parser;
    parser.header_limit(kMaxHeaderBytes);
    parser.body_limit(static_cast<uint64_t>(max_bytes_));
    done = false;
    http::async_read_header(stream, buffer, parser, [&](error_code e, size_t) { ec = e, done = true; });
    wait(done, cancel);
    if (ec == http::error::body_limit)
      throw Error(fmt::format("its Content-Length ({}) passes the limit of {} bytes",
                              parser.content_length().value_or(0), max_bytes_));
    if (ec == http::error::end_of_stream || ec == asio::error::eof)
      throw Error("the server closed the connection without answering");
    if (ec.category() == http::make_error_code(http::error::end_of_stream).category())  // Beast's parse errors
      throw Error(fmt::format("the answer is not an HTTP/1.x response ({})", ec.message()));
    if (ec) throw Error(fmt::format("reading the answer failed ({})", ec.message()));
    return reply(stream, buffer, parser, cancel);
  }

  template <class Stream>
  Reply reply(Stream& stream, boost::beast::flat_buffer& buffer, http::response_parser<http::string_body>& parser,
              FunctionRef<void()> cancel) {
    const auto& head = parser.get();
    const unsigned status = head.result_int();
    Reply r;
    if (status == 301 || status == 302 || status == 303 || status == 307 || status == 308) {
      if (head.find(http::field::location) == head.end())
        throw Error(fmt::format("answered {} without a Location", status));
      r.location = std::string(head[http::field::location]);
      return r;
    }
    if (status != 200) throw Error(fmt::format("answered {} {}", status, std::string(head.reason())));
    if (auto e = head.find(http::field::content_encoding); e != head.end() && ascii_lower(std::string(e->value())) != "identity")
      throw Error(fmt::format("its Content-Encoding is '{}'; only unencoded bodies are read", std::string(e->value())));
    if (auto t = head.find(http::field::content_type); t != head.end()) {
      r.content_type = std::string(t->value());
      if (!declared_media_format(r.content_type, kind_))
        throw Error(fmt::format("its Content-Type is '{}', not {}/*", r.content_type, media_kind_name(kind_)));
    }
    bool done = false;
    error_code ec;
    http::async_read(stream, buffer, parser, [&](error_code e, size_t) { ec = e, done = true; });
    wait(done, cancel);
    if (ec == asio::ssl::error::stream_truncated && parser.is_done()) ec = {};  // closed without TLS close_notify
    if (ec == http::error::body_limit)
      throw Error(fmt::format("its body passes the limit of {} bytes", max_bytes_));
    if (ec) throw Error(fmt::format("reading the body failed ({})", ec.message()));
    r.body = std::move(parser.get().body());
    return r;
  }

  asio::io_context io_;  // first member: destroyed after every socket of the fetch
  MediaKind kind_;
  const MediaFetchOptions& options_;
  int64_t max_bytes_;
  Clock::time_point deadline_;
};

}  // namespace

std::vector<std::string> parse_allowed_media_hosts(std::string_view list) {
  std::vector<std::string> hosts;
  while (!list.empty()) {
    const size_t comma = list.find(',');
    std::string_view entry = list.substr(0, comma);
    list = comma == std::string_view::npos ? "" : list.substr(comma + 1);
    while (!entry.empty() && entry.front() == ' ') entry.remove_prefix(1);
    while (!entry.empty() && entry.back() == ' ') entry.remove_suffix(1);
    std::string host = ascii_lower(entry);
    if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
    const bool valid = host == "*" || (host.starts_with("*.") && is_host_name(host.substr(2))) || is_host_name(host) ||
                       ip_literal(host);
    if (!valid)
      throw Error(fmt::format("allowed media host '{}' is not a host name, '*.domain', '*' or an IP address", entry));
    hosts.push_back(std::move(host));
  }
  return hosts;
}

MediaInput fetch_media(std::string_view url, MediaKind kind, const MediaFetchOptions& options, int64_t max_bytes,
                       std::string where) {
  try {
    Fetch fetch(kind, options, max_bytes);
    std::string content_type;
    MediaInput input;
    input.bytes = fetch.get(parse_url(url), content_type);
    input.kind = kind;
    input.declared_format = content_type.empty() ? "" : *declared_media_format(content_type, kind);
    input.where = std::move(where);
    return input;
  } catch (const Timeout&) {
    throw Error(fmt::format("{}: {}: no complete answer within {:g} s", where, shown(url),
                            std::chrono::duration<double>(options.timeout).count()));
  } catch (const Error& e) {
    throw Error(fmt::format("{}: {}: {}", where, shown(url), e.what()));
  }
}

}  // namespace qs::media
