// Media URLs fetched from a loopback server (plain and TLS) that answers each path its own way: an image, redirects,
// a body too large (declared and streamed), a slow body, a wrong Content-Type, a 404, garbage; and the host rules
// (allow-list, wildcard, non-public addresses) that refuse before any connection.
#include "media/media_fetch.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <atomic>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/read_until.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/asio/streambuf.hpp>
#include <boost/asio/write.hpp>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <map>
#include <mutex>
#include <thread>

#include "util/error.h"
#include "util/file.h"
#include "test_util.h"

namespace {

using namespace qs;
using namespace qs::media;
namespace asio = boost::asio;
using tcp = asio::ip::tcp;

constexpr int64_t kLimit = 8192;  // bytes per item in these tests

const std::string& png_bytes() {
  static const std::string bytes =
      read_file(std::filesystem::path(QATSERVE_SOURCE_DIR) / "tests/fixtures/mm_e2b_like/media/square_50x50.png");
  return bytes;
}

// Writes bytes to the client; false once the client is gone.
using Send = std::function<bool(std::string_view)>;

std::string response(std::string_view status, std::string_view headers, std::string_view body) {
  return std::string("HTTP/1.1 ") + std::string(status) + "\r\n" + std::string(headers) +
         "Content-Length: " + std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + std::string(body);
}

// A server on 127.0.0.1 (TLS when given a certificate) answering one connection at a time: the request's path picks
// the answer. It remembers the last request's header.
class LoopbackServer {
 public:
  explicit LoopbackServer(const std::filesystem::path& cert_dir = {}) : acceptor_(io_, {asio::ip::make_address("127.0.0.1"), 0}) {
    if (!cert_dir.empty()) {
      tls_.emplace(asio::ssl::context::tls_server);
      tls_->use_certificate_chain_file((cert_dir / "cert.pem").string());
      tls_->use_private_key_file((cert_dir / "key.pem").string(), asio::ssl::context::pem);
    }
    thread_ = std::thread([this] { serve(); });
  }
  ~LoopbackServer() {
    stopping_ = true;
    tcp::socket wake(io_);
    boost::system::error_code ec;
    wake.connect(acceptor_.local_endpoint(), ec);
    thread_.join();
  }
  std::string url(std::string_view path, std::string_view host = "127.0.0.1") const {
    return fmt::format("{}://{}:{}{}", tls_ ? "https" : "http", host, acceptor_.local_endpoint().port(), path);
  }
  uint16_t port() const { return acceptor_.local_endpoint().port(); }
  std::string last_request() {
    std::lock_guard lock(mutex_);
    return last_request_;
  }
  bool stopping() const { return stopping_; }

 private:
  void serve() {
    while (!stopping_) {
      tcp::socket socket(io_);
      boost::system::error_code ec;
      acceptor_.accept(socket, ec);
      if (ec || stopping_) continue;
      if (!tls_) {
        answer(socket, [&](std::string_view b) {
          asio::write(socket, asio::buffer(b), ec);
          return !ec;
        });
        continue;
      }
      asio::ssl::stream<tcp::socket&> stream(socket, *tls_);
      stream.handshake(asio::ssl::stream_base::server, ec);
      if (ec) continue;  // the client refused the certificate
      answer(stream, [&](std::string_view b) {
        asio::write(stream, asio::buffer(b), ec);
        return !ec;
      });
    }
  }

  template <class Stream>
  void answer(Stream& stream, const Send& send) {
    asio::streambuf buffer;
    boost::system::error_code ec;
    asio::read_until(stream, buffer, "\r\n\r\n", ec);
    if (ec) return;
    std::string head(asio::buffers_begin(buffer.data()), asio::buffers_end(buffer.data()));
    {
      std::lock_guard lock(mutex_);
      last_request_ = head;
    }
    const size_t space = head.find(' ');
    const std::string path = head.substr(space + 1, head.find(' ', space + 1) - space - 1);
    route(path, send);
  }

  void route(const std::string& path, const Send& send) {
    if (path == "/img.png") send(response("200 OK", "Content-Type: image/png\r\n", png_bytes()));
    else if (path == "/untyped") send(response("200 OK", "", png_bytes()));
    else if (path == "/huge") send("HTTP/1.1 200 OK\r\nContent-Type: image/png\r\nContent-Length: 8193\r\n\r\n");
    else if (path == "/chunked") {
      send("HTTP/1.1 200 OK\r\nContent-Type: image/png\r\nTransfer-Encoding: chunked\r\n\r\n");
      for (int i = 0; i < 12 && send("400\r\n" + std::string(0x400, 'x') + "\r\n"); ++i) {}
    } else if (path == "/slow") {
      send("HTTP/1.1 200 OK\r\nContent-Type: image/png\r\nContent-Length: 1000\r\n\r\n");
      while (!stopping_ && send("x")) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    } else if (path == "/text") send(response("200 OK", "Content-Type: text/html\r\n", "<html></html>"));
    else if (path == "/gzip") send(response("200 OK", "Content-Type: image/png\r\nContent-Encoding: gzip\r\n", "x"));
    else if (path == "/garbage") send(std::string("\x16\x03\x01garbage \xff\xfe\r\n\r\n", 20));
    else if (path == "/silent") return;  // closes without a byte
    else if (path == "/to-relative") send(response("302 Found", "Location: img.png\r\n", ""));
    else if (path == "/to-outside") send(response("301 Moved", "Location: http://example.com/img.png\r\n", ""));
    else if (path == "/to-itself") send(response("307 Temporary Redirect", "Location: /to-itself\r\n", ""));
    else if (path == "/to-localhost")
      send(response("302 Found", fmt::format("Location: http://localhost:{}/img.png\r\n", port()), ""));
    else send(response("404 Not Found", "Content-Type: text/plain\r\n", "no"));
  }

  asio::io_context io_;
  tcp::acceptor acceptor_;
  std::optional<asio::ssl::context> tls_;
  std::atomic<bool> stopping_{false};
  std::mutex mutex_;
  std::string last_request_;
  std::thread thread_;
};

MediaFetchOptions allow(std::string_view hosts) {
  MediaFetchOptions o;
  o.allowed_hosts = parse_allowed_media_hosts(hosts);
  return o;
}

using qs::test::error_of;

std::string fetch_error(const std::string& url, const MediaFetchOptions& options, int64_t limit = kLimit) {
  return error_of([&] { fetch_media(url, MediaKind::Image, options, limit, "messages[0].content[1]"); });
}

#define EXPECT_HAS(haystack, needle) EXPECT_NE((haystack).find(needle), std::string::npos) << (haystack)

TEST(MediaFetch, AllowListEntries) {
  EXPECT_EQ(parse_allowed_media_hosts(" A.com, *.b.org,127.0.0.1 ,[::1],*"),
            (std::vector<std::string>{"a.com", "*.b.org", "127.0.0.1", "::1", "*"}));
  EXPECT_TRUE(parse_allowed_media_hosts("").empty());
  for (const char* bad : {"http://a.com", "*a.com", "a.com/x", "a b", "a.com:80", "*.", "-a.com"})
    EXPECT_HAS(error_of([&] { parse_allowed_media_hosts(std::string("ok.org,") + bad); }),
               fmt::format("allowed media host '{}' is not", bad));
}

TEST(MediaFetch, RefusesBeforeConnecting) {
  const MediaFetchOptions o = allow("127.0.0.1,*.b.org");
  EXPECT_EQ(fetch_error("http://example.com/a.png", o),
            "messages[0].content[1]: http://example.com/a.png: the host 'example.com' is not one this server fetches "
            "media from");
  EXPECT_HAS(fetch_error("http://b.org/a.png", o), "the host 'b.org' is not one");
  EXPECT_HAS(fetch_error("http://xb.org/a.png", o), "the host 'xb.org' is not one");
  EXPECT_HAS(fetch_error("ftp://127.0.0.1/a.png", o), "the scheme 'ftp' is not fetched (http and https only)");
  EXPECT_HAS(fetch_error("file:///etc/passwd", o), "the scheme 'file' is not fetched");
  EXPECT_HAS(fetch_error("http://user:pw@127.0.0.1/a.png", o), "credentials");
  EXPECT_HAS(fetch_error("http://127.0.0.1/a b.png", o), "space or control character");
  EXPECT_HAS(fetch_error("http://127.0.0.1:99999/a.png", o), "the port 99999 is not in 1..65535");
  EXPECT_HAS(fetch_error("http://b\xc3\xa9.b.org/a.png", o), "punycode");
  EXPECT_HAS(fetch_error("http://disabled.org/a.png", MediaFetchOptions{}), "the host 'disabled.org' is not one");
}

TEST(MediaFetch, NonPublicAddressesNeedTheHostListedExactly) {
  const MediaFetchOptions any = allow("*");
  EXPECT_HAS(fetch_error("http://127.0.0.1/a.png", any), "127.0.0.1 is a non-public address (loopback): only a host the server lists exactly");
  EXPECT_HAS(fetch_error("http://10.1.2.3/a.png", any), "a non-public address (private)");
  EXPECT_HAS(fetch_error("http://192.168.0.1/a.png", any), "a non-public address (private)");
  EXPECT_HAS(fetch_error("http://172.20.0.1/a.png", any), "a non-public address (private)");
  EXPECT_HAS(fetch_error("http://169.254.169.254/latest/meta-data", any), "a non-public address (link-local)");
  EXPECT_HAS(fetch_error("http://100.64.0.1/a.png", any), "a non-public address (carrier-grade NAT)");
  EXPECT_HAS(fetch_error("http://0.0.0.0/a.png", any), "a non-public address (unspecified)");
  EXPECT_HAS(fetch_error("http://[::1]/a.png", any), "a non-public address (loopback)");
  EXPECT_HAS(fetch_error("http://[::ffff:127.0.0.1]/a.png", any), "a non-public address (loopback)");
  EXPECT_HAS(fetch_error("http://[fd00::1]/a.png", any), "a non-public address (unique-local)");
  EXPECT_HAS(fetch_error("http://[fe80::1]/a.png", any), "a non-public address (link-local)");
  // A name is judged by what it resolves to: localhost through '*' is refused ...
  EXPECT_HAS(fetch_error("http://localhost/a.png", any), "is a non-public address (loopback)");
  // ... and numeric spellings the resolver accepts are names resolving to the same address.
  EXPECT_HAS(fetch_error("http://2130706433/a.png", any), "2130706433 (127.0.0.1) is a non-public address (loopback)");
}

TEST(MediaFetch, FetchesAnImageFromAnAllowedHost) {
  LoopbackServer server;
  const MediaFetchOptions o = allow("127.0.0.1");
  MediaInput got = fetch_media(server.url("/img.png"), MediaKind::Image, o, kLimit, "messages[0].content[1]");
  EXPECT_EQ(got.bytes, png_bytes());
  EXPECT_EQ(got.declared_format, "png");
  EXPECT_EQ(got.kind, MediaKind::Image);
  EXPECT_EQ(got.where, "messages[0].content[1]");
  const std::string request = server.last_request();
  EXPECT_HAS(request, "GET /img.png HTTP/1.1\r\n");
  EXPECT_HAS(request, fmt::format("Host: 127.0.0.1:{}\r\n", server.port()));
  EXPECT_HAS(request, "Accept: image/*\r\n");
  // No Content-Type: the bytes, with no declared format (the decoder sniffs them).
  EXPECT_EQ(fetch_media(server.url("/untyped"), MediaKind::Image, o, kLimit, "p").declared_format, "");
  // A relative redirect on the same host is followed; localhost listed exactly reaches its loopback address.
  EXPECT_EQ(fetch_media(server.url("/to-relative"), MediaKind::Image, o, kLimit, "p").bytes, png_bytes());
  EXPECT_EQ(fetch_media(server.url("/img.png", "localhost"), MediaKind::Image, allow("localhost"), kLimit, "p").bytes,
            png_bytes());
}

TEST(MediaFetch, EachFailureNamesTheUrlAndWhy) {
  LoopbackServer server;
  MediaFetchOptions o = allow("127.0.0.1,*.b.org");
  auto expect_error = [&](const std::string& path, const std::string& reason) {
    const std::string url = server.url(path);
    EXPECT_EQ(fetch_error(url, o), fmt::format("messages[0].content[1]: {}: {}", url, reason));
  };
  expect_error("/huge", "its Content-Length (8193) passes the limit of 8192 bytes");
  expect_error("/chunked", "its body passes the limit of 8192 bytes");
  expect_error("/text", "its Content-Type is 'text/html', not image/*");
  expect_error("/gzip", "its Content-Encoding is 'gzip'; only unencoded bodies are read");
  expect_error("/missing.png", "answered 404 Not Found");
  expect_error("/silent", "the server closed the connection without answering");
  expect_error("/to-outside", "redirected to http://example.com/img.png: the host 'example.com' is not one this "
                              "server fetches media from");
  expect_error("/to-itself", "more than 3 redirects (the last to /to-itself)");
  EXPECT_HAS(fetch_error(server.url("/to-localhost"), allow("127.0.0.1,*")), "is a non-public address (loopback)");
  EXPECT_HAS(fetch_error(server.url("/garbage"), o), "the answer is not an HTTP/1.x response (");
  // An audio part wants audio/*.
  EXPECT_HAS(error_of([&] { fetch_media(server.url("/img.png"), MediaKind::Audio, o, kLimit, "p"); }),
             "its Content-Type is 'image/png', not audio/*");
  // The deadline covers the whole fetch: a body that trickles in is cut.
  o.timeout = std::chrono::milliseconds(300);
  expect_error("/slow", "no complete answer within 0.3 s");
}

// A self-signed certificate for "localhost" (openssl's command line), for the TLS server.
class MediaFetchTls : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string dir = (std::filesystem::temp_directory_path() / "qatserve-media-fetch-XXXXXX").string();
    ASSERT_NE(mkdtemp(dir.data()), nullptr);
    dir_ = dir;
    const std::string command = fmt::format(
        "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 -subj /CN=localhost "
        "-addext subjectAltName=DNS:localhost -keyout {0}/key.pem -out {0}/cert.pem >/dev/null 2>&1",
        dir_.string());
    if (std::system(command.c_str()) != 0) GTEST_SKIP() << "no openssl command to make a test certificate";
  }
  void TearDown() override {
    unsetenv("SSL_CERT_FILE");
    std::filesystem::remove_all(dir_);
  }
  std::filesystem::path dir_;
};

TEST_F(MediaFetchTls, VerifiesTheCertificateAgainstTheSystemStoreAndTheHostName) {
  LoopbackServer server(dir_);
  const MediaFetchOptions o = allow("localhost,127.0.0.1");
  EXPECT_HAS(fetch_error(server.url("/img.png", "localhost"), o),
             "the TLS handshake with localhost failed (certificate verify failed");
  // OpenSSL's SSL_CERT_FILE adds a CA: then the same server is trusted, for the name its certificate holds only.
  setenv("SSL_CERT_FILE", (dir_ / "cert.pem").c_str(), 1);
  EXPECT_EQ(fetch_media(server.url("/img.png", "localhost"), MediaKind::Image, o, kLimit, "p").bytes, png_bytes());
  EXPECT_HAS(fetch_error(server.url("/img.png", "127.0.0.1"), o),
             "the TLS handshake with 127.0.0.1 failed (certificate verify failed");
}

}  // namespace
