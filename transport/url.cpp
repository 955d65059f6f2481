// Url parsing and printing (forms listed in transport/transport.h).
#include <charconv>
#include <cstdio>

#include "transport/backend_registry.h"
#include "transport/transport.h"

namespace deltacast::transport {
namespace {

[[noreturn]] void bad_url(std::string_view text, const std::string& why) {
  throw Error(Errc::invalid_argument, "bad transport URL '" + std::string(text) + "': " + why);
}

}  // namespace

Url Url::parse(std::string_view text) {
  Url url;
  auto sep = text.find("://");
  if (sep == std::string_view::npos) bad_url(text, "missing '://'");
  std::string_view scheme = text.substr(0, sep);
  std::string_view rest = text.substr(sep + 3);
  if (auto plus = scheme.find('+'); plus != std::string_view::npos) {
    url.provider = std::string(scheme.substr(plus + 1));
    scheme = scheme.substr(0, plus);
  }
  const BackendInfo* backend = find_backend(scheme);
  if (backend == nullptr) bad_url(text, "unknown scheme '" + std::string(scheme) + "' (" + registered_schemes() + ")");
  if (!backend->takes_provider && text.substr(0, sep).find('+') != std::string_view::npos) {
    bad_url(text, backend->name + " takes no '+provider'");
  }
  if (backend->takes_provider && url.provider.empty()) {
    bad_url(text, backend->name + " needs a provider: " + backend->name + "+PROVIDER://");
  }
  url.scheme = std::string(scheme);
  if (backend->address_is_name) {
    if (rest.empty() || rest.find_first_of("/:") != std::string_view::npos) {
      bad_url(text, url.scheme + "://NAME needs a plain name");
    }
    url.host = std::string(rest);
    return url;
  }
  std::string_view host;
  std::string_view port_text;
  if (!rest.empty() && rest.front() == '[') {
    auto close = rest.find(']');
    if (close == std::string_view::npos) bad_url(text, "unterminated '[' in IPv6 host");
    host = rest.substr(1, close - 1);
    rest = rest.substr(close + 1);
    if (rest.empty() || rest.front() != ':') bad_url(text, "missing ':PORT'");
    port_text = rest.substr(1);
  } else {
    auto colon = rest.rfind(':');
    if (colon == std::string_view::npos) bad_url(text, "missing ':PORT'");
    host = rest.substr(0, colon);
    port_text = rest.substr(colon + 1);
    if (host.find(':') != std::string_view::npos) bad_url(text, "IPv6 hosts must be bracketed");
  }
  if (host.empty()) bad_url(text, "empty host");
  unsigned value = 0;
  auto [end, ec] = std::from_chars(port_text.data(), port_text.data() + port_text.size(), value);
  if (port_text.empty() || ec != std::errc{} || end != port_text.data() + port_text.size() || value > 65535) {
    bad_url(text, "port must be a number 0..65535");
  }
  url.host = std::string(host);
  url.port = static_cast<uint16_t>(value);
  return url;
}

std::string Url::full_scheme() const { return provider.empty() ? scheme : scheme + "+" + provider; }

bool Url::is_local() const {
  const BackendInfo* backend = find_backend(scheme);
  if (backend != nullptr && backend->machine_local != nullptr && backend->machine_local(provider)) return true;
  std::string h = host;
  if (h.size() >= 2 && h.front() == '[' && h.back() == ']') h = h.substr(1, h.size() - 2);
  if (h == "localhost" || h == "::1") return true;
  // Numeric IPv4 in 127.0.0.0/8: four decimal octets, the first 127.
  unsigned octets[4];
  char tail = 0;
  if (std::sscanf(h.c_str(), "%3u.%3u.%3u.%3u%c", &octets[0], &octets[1], &octets[2], &octets[3], &tail) == 4)
    return octets[0] == 127 && octets[1] <= 255 && octets[2] <= 255 && octets[3] <= 255;
  return false;
}

std::string Url::str() const {
  const BackendInfo* backend = find_backend(scheme);
  if (backend != nullptr && backend->address_is_name) return scheme + "://" + host;
  bool ipv6 = host.find(':') != std::string::npos;
  return full_scheme() + "://" + (ipv6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

}  // namespace deltacast::transport
