// A broker-side client telemetry receiver for tests (KIP-714), loaded by a Kafka broker as one of
// its metric.reporters: a MetricsReporter that is also a ClientTelemetryExporterProvider (Kafka
// 4.x's plugin interface; the older ClientTelemetry is deprecated).  Each push the broker accepts
// becomes one JSON line in the file named by the broker config telemetry.recorder.file: the
// client instance id, the terminating flag, the payload's content type, the client id and push
// interval of the request, and the payload decoded with the broker's own OpenTelemetry classes
// (resource attributes; each metric's name, kind, temporality and data point attributes).
// testkit/telemetry_recorder.py compiles it and reads the file.

import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.nio.file.StandardOpenOption;
import java.util.List;
import java.util.Map;

import org.apache.kafka.common.metrics.KafkaMetric;
import org.apache.kafka.common.metrics.MetricsReporter;
import org.apache.kafka.server.telemetry.ClientTelemetryContext;
import org.apache.kafka.server.telemetry.ClientTelemetryExporter;
import org.apache.kafka.server.telemetry.ClientTelemetryExporterProvider;
import org.apache.kafka.server.telemetry.ClientTelemetryPayload;
import org.apache.kafka.shaded.io.opentelemetry.proto.common.v1.KeyValue;
import org.apache.kafka.shaded.io.opentelemetry.proto.metrics.v1.Metric;
import org.apache.kafka.shaded.io.opentelemetry.proto.metrics.v1.MetricsData;
import org.apache.kafka.shaded.io.opentelemetry.proto.metrics.v1.NumberDataPoint;
import org.apache.kafka.shaded.io.opentelemetry.proto.metrics.v1.ResourceMetrics;
import org.apache.kafka.shaded.io.opentelemetry.proto.metrics.v1.ScopeMetrics;

public class TelemetryRecorder implements MetricsReporter, ClientTelemetryExporterProvider {
    public static final String FILE_CONFIG = "telemetry.recorder.file";
    private Path out;

    @Override
    public void configure(Map<String, ?> configs) {
        Object file = configs.get(FILE_CONFIG);
        if (file == null) throw new IllegalArgumentException("TelemetryRecorder needs the broker config " + FILE_CONFIG);
        out = Paths.get(file.toString());
    }

    @Override public void init(List<KafkaMetric> metrics) { }
    @Override public void metricChange(KafkaMetric metric) { }
    @Override public void metricRemoval(KafkaMetric metric) { }
    @Override public void close() { }

    @Override
    public ClientTelemetryExporter clientTelemetryExporter() {
        return this::record;
    }

    private synchronized void record(ClientTelemetryContext context, ClientTelemetryPayload payload) {
        StringBuilder line = new StringBuilder("{");
        field(line, "client_instance_id", payload.clientInstanceId().toString()).append(',');
        line.append("\"terminating\":").append(payload.isTerminating()).append(',');
        field(line, "content_type", payload.contentType()).append(',');
        field(line, "client_id", context.authorizableRequestContext().clientId()).append(',');
        line.append("\"push_interval_ms\":").append(context.pushIntervalMs()).append(',');
        try {
            ByteBuffer data = payload.data().duplicate();
            MetricsData metrics = MetricsData.parseFrom(data);
            line.append("\"resource\":{");
            boolean first = true;
            for (ResourceMetrics rm : metrics.getResourceMetricsList()) {
                for (KeyValue kv : rm.getResource().getAttributesList()) {
                    if (!first) line.append(',');
                    first = false;
                    field(line, kv.getKey(), kv.getValue().getStringValue());
                }
            }
            line.append("},\"metrics\":[");
            first = true;
            for (ResourceMetrics rm : metrics.getResourceMetricsList()) {
                for (ScopeMetrics sm : rm.getScopeMetricsList()) {
                    for (Metric m : sm.getMetricsList()) {
                        if (!first) line.append(',');
                        first = false;
                        metric(line, m);
                    }
                }
            }
            line.append("]");
        } catch (IOException | RuntimeException e) {
            field(line, "error", e.toString());
        }
        line.append("}\n");
        try {
            Files.write(out, line.toString().getBytes(StandardCharsets.UTF_8),
                        StandardOpenOption.CREATE, StandardOpenOption.APPEND);
        } catch (IOException e) {
            throw new RuntimeException("TelemetryRecorder cannot write " + out, e);
        }
    }

    private static void metric(StringBuilder line, Metric m) {
        line.append('{');
        field(line, "name", m.getName()).append(',');
        List<NumberDataPoint> points;
        if (m.hasSum()) {
            field(line, "kind", "sum").append(',');
            line.append("\"monotonic\":").append(m.getSum().getIsMonotonic()).append(',');
            line.append("\"temporality\":").append(m.getSum().getAggregationTemporalityValue()).append(',');
            points = m.getSum().getDataPointsList();
        } else if (m.hasGauge()) {
            field(line, "kind", "gauge").append(',');
            points = m.getGauge().getDataPointsList();
        } else {
            field(line, "kind", m.getDataCase().toString()).append('}');
            return;
        }
        line.append("\"points\":[");
        for (int i = 0; i < points.size(); i++) {
            NumberDataPoint p = points.get(i);
            if (i > 0) line.append(',');
            line.append("{\"value\":").append(p.hasAsInt() ? (double) p.getAsInt() : p.getAsDouble());
            line.append(",\"attributes\":{");
            for (int j = 0; j < p.getAttributesCount(); j++) {
                if (j > 0) line.append(',');
                KeyValue kv = p.getAttributes(j);
                field(line, kv.getKey(), kv.getValue().getStringValue());
            }
            line.append("}}");
        }
        line.append("]}");
    }

    private static StringBuilder field(StringBuilder line, String key, String value) {
        return quote(line, key).append(':').append(value == null ? "null" : quote(new StringBuilder(), value).toString());
    }

    private static StringBuilder quote(StringBuilder b, String s) {
        b.append('"');
        for (char c : s.toCharArray()) {
            if (c == '"' || c == '\\') b.append('\\').append(c);
            else if (c < 0x20) b.append(String.format("\\u%04x", (int) c));
            else b.append(c);
        }
        return b.append('"');
    }
}
