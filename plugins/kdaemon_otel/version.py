"""The plugin's instrumentation scope version and the semantic conventions it follows.

OpenTelemetry's messaging conventions are still in development (status "Development"); the
spans follow those of semantic-conventions 1.44.0 (docs/messaging/messaging-spans.md and
kafka.md), the version opentelemetry-semantic-conventions 0.66b1 is generated from.  A span
carries this schema URL, so a backend can translate it when the conventions move on.
"""

VERSION = "0.1.0"
SEMCONV_VERSION = "1.44.0"
SCHEMA_URL = f"https://opentelemetry.io/schemas/{SEMCONV_VERSION}"
