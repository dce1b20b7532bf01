// The reference client beside kdaemon: Apache Kafka's own Java KafkaConsumer and KafkaProducer,
// driven from the command line so tests and benchmarks can compare kdaemon with them field by field.
//
// Compiled by testkit/java_peer.py with javac against the kafka-clients jar of the same Maven
// resolution as the broker (testkit/maven/pom.xml).  Everything it prints on stdout is one
// JSON object per line; logs go to stderr.
//
//   consume  --bootstrap B (--assign t:p,... | --topics t,... | --pattern REGEX | --regex RE2J)
//            [--group G] [--assignor range|roundrobin|sticky|cooperative-sticky] [--instance-id I]
//            [--group-protocol classic|consumer] [--isolation read_committed|read_uncommitted]
//            [--reset earliest|latest|none] [--until-end] [--max-records N] [--idle-ms MS]
//            [--commit sync|none] [--print] [--commands] [--close-membership default|leave|remain]
//            [--set key=value ...]
//     Prints {"event":"building"} right before the KafkaConsumer is built, {"event":"closing"} right
//     before close(), {"event":"assigned"|"revoked"|"lost", "partitions":[[t,p],...]} from the rebalance
//     listener (every event with "t", monotonic seconds: System.nanoTime() / 1e9), each record
//     (with --print) as {"topic","partition","offset","timestamp","timestamp_type","leader_epoch",
//     "key","value","headers"} (bytes as base64, null kept), and
//     last {"event":"end","count","positions":[[t,p,offset],...],"lags":[[t,p,currentLag|null],...],
//     "committed":[[t,p,offset],...]}.
//     --until-end (assign mode): stop once every position reached the end offset read at start
//     (the last stable offset under read_committed).  SIGTERM stops polling, commits when asked,
//     and closes (leaving the group; --close-membership: close with
//     CloseOptions.groupMembershipOperation DEFAULT, LEAVE_GROUP or REMAIN_IN_GROUP, KIP-1092).  --commands: JSON lines on stdin, run between polls on the
//     consumer's thread: {"op":"committed","partitions":[[t,p],...]} prints {"event":"read",
//     "offsets":[[t,p,offset,metadata],...]} (offset -1 and metadata null when none), and
//     {"op":"commit","offsets":[[t,p,offset,metadata],...]} commits them (commitSync) and prints
//     {"event":"commit_done"}.
//   share    --bootstrap B --group G --topics t,... [--mode implicit|explicit] [--max-records N]
//            [--verdicts p:o:TYPE,...] [--set key=value ...]
//     A KafkaShareConsumer (KIP-932) in share group G.  Prints {"event":"building"}, each record as
//     consume --print does plus "delivery_count" (explicit mode: each acknowledged ACCEPT at once;
//     implicit: the next poll accepts them), {"event":"end","count"} once N records came or on
//     SIGTERM (after commitSync), then {"event":"closing"} and closes.  --verdicts (explicit mode):
//     the first time partition p's offset o comes, it is acknowledged TYPE (accept, release, reject,
//     renew) instead of ACCEPT; every record printed carries "poll" (the number of the poll that
//     returned it, counting polls with records) and "verdict"; after each such poll, commitSync.
//   times    --bootstrap B --query t:p:timestamp,...  [--isolation ...]
//     Prints {"topic","partition","timestamp","offset","leader_epoch","found_timestamp"} per query
//     (offset null when nothing is at or after the timestamp), then beginning and end offsets.
//   produce  --bootstrap B --topic T [--compression C] [--transactional-id ID] [--set k=v ...]
//     Reads JSON lines on stdin: records {"partition","key","value","headers","timestamp"} (bytes as
//     base64, null kept), and {"txn":"begin"|"commit"|"abort"}, {"flush":true}, and
//     {"compression":C} (non-transactional only: close the producer, go on with a new one using
//     codec C, so one run writes batches of every codec).  Prints one {"partition","offset"} per
//     record in input order once it is acknowledged.
//   bench    --bootstrap B --assign t:p,... --mode raw|json|filter --expected n0,n1,...
//            [--header type --value V] [--max-seconds S] [--samples] [--set k=v ...]
//     The benchmark workload of bench/consume: raw = value length, json = parse every value
//     with Jackson and add up "id", filter = keep records whose header equals V, parse those.
//     Assigned from offset 0; stops when every partition has had its expected count of records
//     (more is an error), or after S seconds ("capped").  Steady-state timing as the Python
//     clients: from the end of the first poll that returned records to the last expected record.
//     Prints one result object with bench/consume's field names (records_per_s, steady_cpu_s,
//     first_record_s, rss_peak_mb, ...) and the JVM's own costs (construct_s, jit_compile_s,
//     gc_s); --samples adds [t, records, cpu_s, run-queue wait_s] after every poll (bench/daemon).
//   share-bench --bootstrap B --group G --topic T --mode raw|json|filter --expected n0,n1,...
//            [--ack implicit|explicit] [--header type --value V] [--max-seconds S] [--set k=v ...]
//     bench's workload through a KafkaShareConsumer (KIP-932) subscribed to T in share group G
//     (bench/share): explicit acknowledges every record ACCEPT as it is processed, implicit
//     leaves it to the next poll; once every partition had its expected count, commitSync (inside
//     the clock: settling the records is part of the work), then one result object with bench's
//     field names plus "commit_s".  A record delivered twice is an error, as more than expected is.

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.lang.management.ManagementFactory;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Paths;
import java.time.Duration;
import java.util.*;
import java.util.concurrent.Future;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.regex.Pattern;
import org.apache.kafka.clients.consumer.*;
import org.apache.kafka.clients.producer.*;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.errors.WakeupException;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.header.internals.RecordHeaders;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;

public final class KafkaPeer {
    private static final ObjectMapper JSON = new ObjectMapper();
    private static final Base64.Encoder B64 = Base64.getEncoder();
    private static final Base64.Decoder B64D = Base64.getDecoder();

    public static void main(String[] argv) throws Exception {
        if (argv.length == 0) throw new IllegalArgumentException("usage: KafkaPeer consume|share|times|produce|bench|share-bench ...");
        Map<String, List<String>> args = parse(Arrays.copyOfRange(argv, 1, argv.length));
        switch (argv[0]) {
            case "consume": consume(args); break;
            case "share": share(args); break;
            case "times": times(args); break;
            case "produce": produce(args); break;
            case "bench": bench(args); break;
            case "share-bench": shareBench(args); break;
            default: throw new IllegalArgumentException("unknown command " + argv[0]);
        }
    }

    // --- arguments -----------------------------------------------------------------------------

    private static Map<String, List<String>> parse(String[] argv) {
        Map<String, List<String>> out = new HashMap<>();
        for (int i = 0; i < argv.length; i++) {
            String name = argv[i];
            if (!name.startsWith("--")) throw new IllegalArgumentException("expected --option, got " + name);
            boolean flag = i + 1 == argv.length || argv[i + 1].startsWith("--");
            out.computeIfAbsent(name.substring(2), k -> new ArrayList<>()).add(flag ? "true" : argv[++i]);
        }
        return out;
    }

    private static String opt(Map<String, List<String>> a, String name, String dflt) {
        List<String> v = a.get(name);
        return v == null ? dflt : v.get(v.size() - 1);
    }

    private static String req(Map<String, List<String>> a, String name) {
        String v = opt(a, name, null);
        if (v == null) throw new IllegalArgumentException("--" + name + " is required");
        return v;
    }

    private static void applySets(Map<String, List<String>> a, Properties p) {
        for (String kv : a.getOrDefault("set", List.of())) {
            int eq = kv.indexOf('=');
            if (eq < 0) throw new IllegalArgumentException("--set takes key=value, got " + kv);
            p.put(kv.substring(0, eq), kv.substring(eq + 1));
        }
    }

    private static List<TopicPartition> partitions(String spec) {
        List<TopicPartition> out = new ArrayList<>();
        for (String tp : spec.split(",")) {
            int colon = tp.lastIndexOf(':');
            out.add(new TopicPartition(tp.substring(0, colon), Integer.parseInt(tp.substring(colon + 1))));
        }
        return out;
    }

    private static Properties consumerProps(Map<String, List<String>> a) {
        Properties p = new Properties();
        p.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, req(a, "bootstrap"));
        p.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        p.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        p.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
        p.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, opt(a, "reset", "earliest"));
        p.put(ConsumerConfig.ISOLATION_LEVEL_CONFIG, opt(a, "isolation", "read_uncommitted"));
        p.put(ConsumerConfig.CLIENT_ID_CONFIG, opt(a, "client-id", "java-peer"));
        String group = opt(a, "group", null);
        if (group != null) p.put(ConsumerConfig.GROUP_ID_CONFIG, group);
        String instance = opt(a, "instance-id", null);
        if (instance != null) p.put(ConsumerConfig.GROUP_INSTANCE_ID_CONFIG, instance);
        String protocol = opt(a, "group-protocol", "classic");
        p.put(ConsumerConfig.GROUP_PROTOCOL_CONFIG, protocol);
        String assignor = opt(a, "assignor", null);
        if (assignor != null) {
            if (protocol.equals("consumer")) {
                p.put(ConsumerConfig.GROUP_REMOTE_ASSIGNOR_CONFIG, assignor);
            } else {
                p.put(ConsumerConfig.PARTITION_ASSIGNMENT_STRATEGY_CONFIG, assignorClass(assignor));
            }
        }
        applySets(a, p);
        return p;
    }

    private static String assignorClass(String name) {
        switch (name) {
            case "range": return RangeAssignor.class.getName();
            case "roundrobin": return RoundRobinAssignor.class.getName();
            case "sticky": return StickyAssignor.class.getName();
            case "cooperative-sticky": return CooperativeStickyAssignor.class.getName();
            default: throw new IllegalArgumentException("unknown assignor " + name);
        }
    }

    // --- output --------------------------------------------------------------------------------

    private static synchronized void emit(ObjectNode o) {
        try {
            System.out.println(JSON.writeValueAsString(o));
            System.out.flush();
        } catch (Exception e) {
            throw new RuntimeException(e);
        }
    }

    private static String b64(byte[] b) {
        return b == null ? null : B64.encodeToString(b);
    }

    private static ArrayNode tpArray(Collection<TopicPartition> tps) {
        ArrayNode arr = JSON.createArrayNode();
        List<TopicPartition> sorted = new ArrayList<>(tps);
        sorted.sort(Comparator.comparing(TopicPartition::topic).thenComparingInt(TopicPartition::partition));
        for (TopicPartition tp : sorted) arr.addArray().add(tp.topic()).add(tp.partition());
        return arr;
    }

    private static ArrayNode offsetArray(Map<TopicPartition, Long> offsets) {
        ArrayNode arr = JSON.createArrayNode();
        List<TopicPartition> keys = new ArrayList<>(offsets.keySet());
        keys.sort(Comparator.comparing(TopicPartition::topic).thenComparingInt(TopicPartition::partition));
        for (TopicPartition tp : keys) arr.addArray().add(tp.topic()).add(tp.partition()).add(offsets.get(tp));
        return arr;
    }

    // Every event carries "t": System.nanoTime() in seconds, which HotSpot on Linux reads from
    // CLOCK_MONOTONIC, the clock of Python's time.monotonic(): bench/groups combines the
    // Java members' events with the Python members' on one time line.
    private static ObjectNode event(String name) {
        ObjectNode o = JSON.createObjectNode();
        o.put("event", name);
        o.put("t", System.nanoTime() / 1e9);
        return o;
    }

    private static ObjectNode recordJson(ConsumerRecord<byte[], byte[]> r) {
        ObjectNode o = JSON.createObjectNode();
        o.put("topic", r.topic());
        o.put("partition", r.partition());
        o.put("offset", r.offset());
        o.put("timestamp", r.timestamp());
        o.put("timestamp_type", r.timestampType().name);
        if (r.leaderEpoch().isPresent()) o.put("leader_epoch", r.leaderEpoch().get());
        else o.putNull("leader_epoch");
        o.put("key", b64(r.key()));
        o.put("value", b64(r.value()));
        ArrayNode hs = o.putArray("headers");
        for (Header h : r.headers()) hs.addArray().add(h.key()).add(b64(h.value()));
        return o;
    }

    // --- consume -------------------------------------------------------------------------------

    private static void consume(Map<String, List<String>> a) throws Exception {
        Properties props = consumerProps(a);
        emit(event("building"));   // the clock of bench/groups starts here, as for its Python members
        KafkaConsumer<byte[], byte[]> consumer = new KafkaConsumer<>(props);
        AtomicBoolean stopping = new AtomicBoolean(false);
        Thread main = Thread.currentThread();
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            stopping.set(true);
            consumer.wakeup();
            try { main.join(30_000); } catch (InterruptedException ignored) { }
        }));
        boolean print = a.containsKey("print");
        boolean commit = opt(a, "commit", "none").equals("sync");
        long maxRecords = Long.parseLong(opt(a, "max-records", "-1"));
        long idleMs = Long.parseLong(opt(a, "idle-ms", "-1"));
        ConsumerRebalanceListener listener = new ConsumerRebalanceListener() {
            public void onPartitionsRevoked(Collection<TopicPartition> ps) {
                if (commit && !ps.isEmpty()) consumer.commitSync();
                emit(withPartitions(event("revoked"), ps));
            }
            public void onPartitionsAssigned(Collection<TopicPartition> ps) {
                emit(withPartitions(event("assigned"), ps));
            }
            public void onPartitionsLost(Collection<TopicPartition> ps) {
                emit(withPartitions(event("lost"), ps));
            }
        };
        Map<TopicPartition, Long> end = null;
        if (a.containsKey("assign")) {
            List<TopicPartition> tps = partitions(req(a, "assign"));
            consumer.assign(tps);
            if (a.containsKey("until-end")) end = consumer.endOffsets(tps);
        } else if (a.containsKey("pattern")) {
            consumer.subscribe(Pattern.compile(req(a, "pattern")), listener);
        } else if (a.containsKey("regex")) {
            // KIP-848: the broker matches the RE2J expression against whole topic names
            // (group.protocol=consumer only); --pattern matches here, in the client.
            consumer.subscribe(new SubscriptionPattern(req(a, "regex")), listener);
        } else {
            consumer.subscribe(Arrays.asList(req(a, "topics").split(",")), listener);
        }
        long count = 0;
        long lastRecord = System.nanoTime();
        java.util.concurrent.BlockingQueue<String> commands = new java.util.concurrent.LinkedBlockingQueue<>();
        if (a.containsKey("commands")) {
            Thread reader = new Thread(() -> {
                try (BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8))) {
                    String line;
                    while ((line = in.readLine()) != null) if (!line.isBlank()) commands.add(line);
                } catch (Exception ignored) {
                    // stdin closed with the process
                }
            });
            reader.setDaemon(true);
            reader.start();
        }
        try {
            while (!stopping.get()) {
                for (String line; (line = commands.poll()) != null; ) runCommand(consumer, JSON.readTree(line));
                if (end != null && reachedEnd(consumer, end)) break;
                if (maxRecords >= 0 && count >= maxRecords) break;
                if (idleMs >= 0 && (System.nanoTime() - lastRecord) / 1_000_000 > idleMs) break;
                ConsumerRecords<byte[], byte[]> recs;
                try {
                    recs = consumer.poll(Duration.ofMillis(200));
                } catch (WakeupException e) {
                    break;
                }
                if (!recs.isEmpty()) lastRecord = System.nanoTime();
                for (ConsumerRecord<byte[], byte[]> r : recs) {
                    count++;
                    if (print) emit(recordJson(r));
                }
                if (commit && !recs.isEmpty()) {
                    consumer.commitSync();
                    emit(withOffsets(event("committed"), committedOf(consumer, consumer.assignment())));
                }
            }
            ObjectNode done = event("end");
            done.put("count", count);
            Map<TopicPartition, Long> positions = new HashMap<>();
            for (TopicPartition tp : consumer.assignment()) positions.put(tp, consumer.position(tp));
            done.set("positions", offsetArray(positions));
            // currentLag: from the last fetch's high watermark or (read_committed) last stable offset.
            ArrayNode lags = done.putArray("lags");
            List<TopicPartition> assigned = new ArrayList<>(consumer.assignment());
            assigned.sort(Comparator.comparing(TopicPartition::topic).thenComparingInt(TopicPartition::partition));
            for (TopicPartition tp : assigned) {
                OptionalLong lag = consumer.currentLag(tp);
                ArrayNode row = lags.addArray().add(tp.topic()).add(tp.partition());
                if (lag.isPresent()) row.add(lag.getAsLong()); else row.addNull();
            }
            if (commit) consumer.commitSync();
            if (consumerPropsHaveGroup(a)) done.set("committed", offsetArray(committedOf(consumer, consumer.assignment())));
            emit(done);
        } finally {
            emit(event("closing"));   // bench/groups times a member's leave from here
            consumer.close(CloseOptions.timeout(Duration.ofSeconds(30))
                    .withGroupMembershipOperation(membership(opt(a, "close-membership", "default"))));
        }
    }

    // --- share ---------------------------------------------------------------------------------

    private static void share(Map<String, List<String>> a) throws Exception {
        Properties props = new Properties();
        props.put("bootstrap.servers", req(a, "bootstrap"));
        props.put("group.id", req(a, "group"));
        props.put("key.deserializer", ByteArrayDeserializer.class.getName());
        props.put("value.deserializer", ByteArrayDeserializer.class.getName());
        boolean explicit = opt(a, "mode", "implicit").equals("explicit");
        props.put("share.acknowledgement.mode", explicit ? "explicit" : "implicit");
        applySets(a, props);
        long maxRecords = Long.parseLong(opt(a, "max-records", "-1"));
        Map<String, AcknowledgeType> verdicts = new HashMap<>();
        String script = opt(a, "verdicts", null);
        if (script != null) {
            if (!explicit) throw new IllegalArgumentException("--verdicts needs --mode explicit");
            for (String v : script.split(",")) {
                String[] f = v.split(":");
                verdicts.put(f[0] + ":" + f[1], AcknowledgeType.valueOf(f[2].toUpperCase(Locale.ROOT)));
            }
        }
        Set<String> seen = new HashSet<>();
        long polls = 0;
        emit(event("building"));
        KafkaShareConsumer<byte[], byte[]> consumer = new KafkaShareConsumer<>(props);
        AtomicBoolean stopping = new AtomicBoolean(false);
        Thread main = Thread.currentThread();
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            stopping.set(true);
            consumer.wakeup();
            try { main.join(30_000); } catch (InterruptedException ignored) { }
        }));
        consumer.subscribe(Arrays.asList(req(a, "topics").split(",")));
        long count = 0;
        try {
            while (!stopping.get() && (maxRecords < 0 || count < maxRecords)) {
                ConsumerRecords<byte[], byte[]> recs;
                try {
                    recs = consumer.poll(Duration.ofMillis(200));
                } catch (WakeupException e) {
                    break;
                }
                if (!recs.isEmpty()) polls++;
                for (ConsumerRecord<byte[], byte[]> r : recs) {
                    count++;
                    ObjectNode o = recordJson(r);
                    if (r.deliveryCount().isPresent()) o.put("delivery_count", r.deliveryCount().get());
                    else o.putNull("delivery_count");
                    String key = r.partition() + ":" + r.offset();
                    AcknowledgeType verdict = seen.add(key) ? verdicts.getOrDefault(key, AcknowledgeType.ACCEPT)
                                                            : AcknowledgeType.ACCEPT;
                    if (script != null) {
                        o.put("poll", polls);
                        o.put("verdict", verdict.toString());
                    }
                    emit(o);
                    if (explicit) consumer.acknowledge(r, verdict);
                }
                if (script != null && !recs.isEmpty()) consumer.commitSync(Duration.ofSeconds(30));
            }
            try {
                consumer.commitSync(Duration.ofSeconds(30));
            } catch (WakeupException ignored) {
                // stopping: close() still sends what is pending
            }
            ObjectNode done = event("end");
            done.put("count", count);
            emit(done);
        } finally {
            emit(event("closing"));
            consumer.close(Duration.ofSeconds(30));
        }
    }

    private static CloseOptions.GroupMembershipOperation membership(String name) {
        switch (name) {
            case "default": return CloseOptions.GroupMembershipOperation.DEFAULT;
            case "leave": return CloseOptions.GroupMembershipOperation.LEAVE_GROUP;
            case "remain": return CloseOptions.GroupMembershipOperation.REMAIN_IN_GROUP;
            default: throw new IllegalArgumentException("unknown --close-membership " + name);
        }
    }

    // A --commands line, on the consumer's own thread (KafkaConsumer is single-threaded).
    private static void runCommand(KafkaConsumer<byte[], byte[]> consumer, JsonNode cmd) {
        String op = cmd.get("op").asText();
        if (op.equals("committed")) {
            Set<TopicPartition> tps = new HashSet<>();
            for (JsonNode tp : cmd.get("partitions")) tps.add(new TopicPartition(tp.get(0).asText(), tp.get(1).asInt()));
            Map<TopicPartition, OffsetAndMetadata> found = consumer.committed(tps, Duration.ofSeconds(30));
            List<TopicPartition> sorted = new ArrayList<>(tps);
            sorted.sort(Comparator.comparing(TopicPartition::topic).thenComparingInt(TopicPartition::partition));
            ObjectNode o = event("read");
            ArrayNode arr = o.putArray("offsets");
            for (TopicPartition tp : sorted) {
                OffsetAndMetadata om = found.get(tp);
                ArrayNode row = arr.addArray().add(tp.topic()).add(tp.partition()).add(om == null ? -1L : om.offset());
                if (om == null) row.addNull(); else row.add(om.metadata());
            }
            emit(o);
        } else if (op.equals("commit")) {
            Map<TopicPartition, OffsetAndMetadata> offsets = new HashMap<>();
            for (JsonNode r : cmd.get("offsets")) {
                offsets.put(new TopicPartition(r.get(0).asText(), r.get(1).asInt()),
                            new OffsetAndMetadata(r.get(2).asLong(), r.get(3).isNull() ? "" : r.get(3).asText()));
            }
            consumer.commitSync(offsets);
            emit(event("commit_done"));
        } else {
            throw new IllegalArgumentException("unknown command " + op);
        }
    }

    private static boolean consumerPropsHaveGroup(Map<String, List<String>> a) {
        return a.containsKey("group");
    }

    private static Map<TopicPartition, Long> committedOf(KafkaConsumer<byte[], byte[]> c, Set<TopicPartition> tps) {
        Map<TopicPartition, Long> out = new HashMap<>();
        if (tps.isEmpty()) return out;
        for (Map.Entry<TopicPartition, OffsetAndMetadata> e : c.committed(tps).entrySet()) {
            out.put(e.getKey(), e.getValue() == null ? -1L : e.getValue().offset());
        }
        return out;
    }

    private static boolean reachedEnd(KafkaConsumer<byte[], byte[]> c, Map<TopicPartition, Long> end) {
        for (Map.Entry<TopicPartition, Long> e : end.entrySet()) {
            if (c.position(e.getKey()) < e.getValue()) return false;
        }
        return true;
    }

    private static ObjectNode withPartitions(ObjectNode o, Collection<TopicPartition> ps) {
        o.set("partitions", tpArray(ps));
        return o;
    }

    private static ObjectNode withOffsets(ObjectNode o, Map<TopicPartition, Long> offsets) {
        o.set("offsets", offsetArray(offsets));
        return o;
    }

    // --- times ---------------------------------------------------------------------------------

    private static void times(Map<String, List<String>> a) {
        Properties p = consumerProps(a);
        try (KafkaConsumer<byte[], byte[]> consumer = new KafkaConsumer<>(p)) {
            Map<TopicPartition, Long> query = new LinkedHashMap<>();
            List<String[]> order = new ArrayList<>();
            for (String q : req(a, "query").split(",")) {
                String[] parts = q.split(":");
                TopicPartition tp = new TopicPartition(parts[0], Integer.parseInt(parts[1]));
                order.add(parts);
                Map<TopicPartition, Long> one = Map.of(tp, Long.parseLong(parts[2]));
                // one call per query: the same partition may be asked for several timestamps
                OffsetAndTimestamp found = consumer.offsetsForTimes(one, Duration.ofSeconds(30)).get(tp);
                ObjectNode o = JSON.createObjectNode();
                o.put("topic", tp.topic());
                o.put("partition", tp.partition());
                o.put("timestamp", Long.parseLong(parts[2]));
                if (found == null) {
                    o.putNull("offset");
                    o.putNull("found_timestamp");
                    o.putNull("leader_epoch");
                } else {
                    o.put("offset", found.offset());
                    o.put("found_timestamp", found.timestamp());
                    if (found.leaderEpoch().isPresent()) o.put("leader_epoch", found.leaderEpoch().get());
                    else o.putNull("leader_epoch");
                }
                emit(o);
                query.put(tp, 0L);
            }
            ObjectNode bounds = event("bounds");
            bounds.set("beginning", offsetArray(consumer.beginningOffsets(query.keySet(), Duration.ofSeconds(30))));
            bounds.set("end", offsetArray(consumer.endOffsets(query.keySet(), Duration.ofSeconds(30))));
            emit(bounds);
        }
    }

    // --- produce -------------------------------------------------------------------------------

    private static void produce(Map<String, List<String>> a) throws Exception {
        Properties p = new Properties();
        p.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, req(a, "bootstrap"));
        p.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        p.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        p.put(ProducerConfig.COMPRESSION_TYPE_CONFIG, opt(a, "compression", "none"));
        p.put(ProducerConfig.ACKS_CONFIG, "all");
        p.put(ProducerConfig.LINGER_MS_CONFIG, "5");
        String txnId = opt(a, "transactional-id", null);
        if (txnId != null) p.put(ProducerConfig.TRANSACTIONAL_ID_CONFIG, txnId);
        applySets(a, p);
        String topic = req(a, "topic");
        List<Future<RecordMetadata>> pending = new ArrayList<>();
        KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(p);
        try {
            if (txnId != null) producer.initTransactions();
            BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
            String line;
            while ((line = in.readLine()) != null) {
                if (line.isBlank()) continue;
                JsonNode o = JSON.readTree(line);
                if (o.has("txn")) {
                    String what = o.get("txn").asText();
                    if (what.equals("begin")) producer.beginTransaction();
                    else if (what.equals("commit")) producer.commitTransaction();
                    else if (what.equals("abort")) { producer.flush(); producer.abortTransaction(); }
                    else throw new IllegalArgumentException("txn is begin, commit or abort, got " + what);
                    continue;
                }
                if (o.has("flush")) {
                    producer.flush();
                    continue;
                }
                if (o.has("compression")) {
                    if (txnId != null) throw new IllegalArgumentException("a codec switch needs a non-transactional producer");
                    producer.close();  // sends and acknowledges everything queued: the futures complete
                    p.put(ProducerConfig.COMPRESSION_TYPE_CONFIG, o.get("compression").asText());
                    producer = new KafkaProducer<>(p);
                    continue;
                }
                Integer partition = o.hasNonNull("partition") ? o.get("partition").asInt() : null;
                Long ts = o.hasNonNull("timestamp") ? o.get("timestamp").asLong() : null;
                RecordHeaders headers = new RecordHeaders();
                if (o.has("headers")) {
                    for (JsonNode h : o.get("headers")) {
                        headers.add(h.get(0).asText(), h.get(1).isNull() ? null : B64D.decode(h.get(1).asText()));
                    }
                }
                byte[] key = o.hasNonNull("key") ? B64D.decode(o.get("key").asText()) : null;
                byte[] value = o.hasNonNull("value") ? B64D.decode(o.get("value").asText()) : null;
                pending.add(producer.send(new ProducerRecord<>(topic, partition, ts, key, value, headers)));
            }
            producer.flush();
            for (Future<RecordMetadata> f : pending) {
                ObjectNode r = JSON.createObjectNode();
                try {
                    RecordMetadata md = f.get();
                    r.put("partition", md.partition());
                    r.put("offset", md.offset());
                } catch (java.util.concurrent.ExecutionException e) {
                    // A record of an aborted transaction fails with TransactionAbortedException.
                    r.put("error", e.getCause().getClass().getSimpleName());
                }
                emit(r);
            }
        } finally {
            producer.close();
        }
    }

    // --- bench ---------------------------------------------------------------------------------

    // The timing matches bench/consume's Tally: the clock starts after the consumer is built,
    // assigned and positioned (just before the first poll call); the steady-state window runs
    // from the end of the first poll that returned records to the last expected record, and the
    // records of that first poll are not counted in it.  CPU is the whole JVM's (every thread:
    // the consumer's network thread, GC, the JIT compilers), as RUSAGE_SELF is for the Python
    // children.  Nothing is warmed up first: the JIT compiles while the records stream, as the
    // Python clients get no warm-up either; jit_compile_s and first_record_s say what it cost.
    private static void bench(Map<String, List<String>> a) throws Exception {
        String mode = req(a, "mode");
        if (!mode.equals("raw") && !mode.equals("json") && !mode.equals("filter")) {
            throw new IllegalArgumentException("--mode is raw, json or filter, got " + mode);
        }
        boolean raw = mode.equals("raw"), json = mode.equals("json");
        String headerName = opt(a, "header", "type");
        byte[] target = opt(a, "value", "order.shipped").getBytes(StandardCharsets.UTF_8);
        double maxSeconds = Double.parseDouble(opt(a, "max-seconds", "300"));
        boolean sampling = a.containsKey("samples");
        List<TopicPartition> tps = partitions(req(a, "assign"));
        String[] exp = req(a, "expected").split(",");
        if (exp.length != tps.size()) {
            throw new IllegalArgumentException("--expected has " + exp.length + " counts for " + tps.size() + " partitions");
        }
        long[] expected = new long[tps.size()];
        long[] counts = new long[tps.size()];
        long left = 0;
        for (int i = 0; i < exp.length; i++) { expected[i] = Long.parseLong(exp[i]); left += expected[i]; }
        Map<TopicPartition, Integer> index = new HashMap<>();
        for (int i = 0; i < tps.size(); i++) index.put(tps.get(i), i);
        var os = (com.sun.management.OperatingSystemMXBean) ManagementFactory.getOperatingSystemMXBean();
        var runtime = ManagementFactory.getRuntimeMXBean();
        var jit = ManagementFactory.getCompilationMXBean();
        long constructStart = System.nanoTime(), cpuConstruct = os.getProcessCpuTime();
        ArrayNode samples = JSON.createArrayNode();
        long t0, cpu0, tFirst = 0, cpuFirst = 0, tLast, cpuEnd, counted = 0, firstBatch = 0, kept = 0, check = 0;
        double jvmUptime, constructS, rssSetup, jit0;
        boolean capped = false;
        try (KafkaConsumer<byte[], byte[]> consumer = new KafkaConsumer<>(consumerProps(a))) {
            consumer.assign(tps);
            for (TopicPartition tp : tps) consumer.seek(tp, 0L);
            rssSetup = peakRssMb();
            jvmUptime = runtime.getUptime() / 1e3;
            jit0 = jit.getTotalCompilationTime() / 1e3;
            t0 = System.nanoTime();
            cpu0 = os.getProcessCpuTime();
            constructS = (t0 - constructStart) / 1e9;
            if (sampling) sample(samples, 0, 0, 0.0);
            while (true) {
                ConsumerRecords<byte[], byte[]> recs = consumer.poll(Duration.ofMillis(1000));
                for (ConsumerRecord<byte[], byte[]> r : recs) {
                    if (raw) {
                        check += r.value().length;
                        kept++;
                    } else if (json) {
                        check += JSON.readTree(r.value()).get("id").asLong();
                        kept++;
                    } else {
                        Header h = r.headers().lastHeader(headerName);
                        if (h != null && Arrays.equals(h.value(), target)) {
                            check += JSON.readTree(r.value()).get("id").asLong();
                            kept++;
                        }
                    }
                }
                for (TopicPartition tp : recs.partitions()) {
                    int i = index.get(tp);
                    int c = recs.records(tp).size();
                    counts[i] += c;
                    if (counts[i] > expected[i]) {
                        throw new IllegalStateException("partition " + tp + ": " + counts[i] + " records counted, only "
                                                        + expected[i] + " were produced (duplicates?)");
                    }
                    counted += c;
                    left -= c;
                }
                long now = System.nanoTime();
                if (tFirst == 0 && counted > 0) {
                    tFirst = now;
                    cpuFirst = os.getProcessCpuTime();
                    firstBatch = counted;
                }
                if (sampling) sample(samples, (now - t0) / 1e9, counted, (os.getProcessCpuTime() - cpu0) / 1e9);
                if (left == 0 || (now - t0) / 1e9 > maxSeconds) {
                    tLast = now;
                    cpuEnd = os.getProcessCpuTime();
                    capped = left > 0;
                    break;
                }
            }
        }
        double seconds = (tLast - t0) / 1e9, steady = tFirst == 0 ? 0 : (tLast - tFirst) / 1e9;
        long gcCount = 0, gcMs = 0;
        for (var gc : ManagementFactory.getGarbageCollectorMXBeans()) {
            gcCount += Math.max(0, gc.getCollectionCount());
            gcMs += Math.max(0, gc.getCollectionTime());
        }
        ObjectNode out = JSON.createObjectNode();
        out.put("mode", mode);
        out.put("records", counted);
        out.put("seconds", seconds);
        out.put("rate_incl_setup", seconds > 0 ? counted / seconds : 0.0);
        if (tFirst == 0) out.putNull("first_record_s"); else out.put("first_record_s", (tFirst - t0) / 1e9);
        out.put("first_batch", firstBatch);
        out.put("steady_seconds", steady);
        if (counted > firstBatch && steady > 0) out.put("records_per_s", (counted - firstBatch) / steady);
        else out.putNull("records_per_s");
        out.put("cpu_s", (cpuEnd - cpu0) / 1e9);
        if (tFirst == 0) out.putNull("steady_cpu_s"); else out.put("steady_cpu_s", (cpuEnd - cpuFirst) / 1e9);
        out.put("check", check);
        out.put("kept", kept);
        out.put("capped", capped);
        ArrayNode cs = out.putArray("counts");
        for (long c : counts) cs.add(c);
        out.put("rss_setup_mb", rssSetup);
        out.put("rss_peak_mb", peakRssMb());
        // What the JVM spent before the first poll, and on itself while consuming.
        out.put("jvm_uptime_at_first_poll_s", jvmUptime);
        out.put("construct_s", constructS);
        out.put("construct_cpu_s", (cpu0 - cpuConstruct) / 1e9);
        out.put("jit_compile_s", jit.getTotalCompilationTime() / 1e3 - jit0);
        out.put("gc_count", gcCount);
        out.put("gc_s", gcMs / 1e3);
        out.put("max_heap_mb", Runtime.getRuntime().maxMemory() / 1048576.0);
        out.put("java", System.getProperty("java.vm.name") + " " + System.getProperty("java.version"));
        if (sampling) out.set("samples", samples);
        emit(out);
    }

    // --- share-bench ---------------------------------------------------------------------------

    private static void shareBench(Map<String, List<String>> a) throws Exception {
        String mode = req(a, "mode");
        if (!mode.equals("raw") && !mode.equals("json") && !mode.equals("filter")) {
            throw new IllegalArgumentException("--mode is raw, json or filter, got " + mode);
        }
        boolean raw = mode.equals("raw"), json = mode.equals("json");
        boolean explicit = opt(a, "ack", "implicit").equals("explicit");
        String headerName = opt(a, "header", "type");
        byte[] target = opt(a, "value", "order.shipped").getBytes(StandardCharsets.UTF_8);
        double maxSeconds = Double.parseDouble(opt(a, "max-seconds", "300"));
        String[] exp = req(a, "expected").split(",");
        long[] expected = new long[exp.length];
        long[] counts = new long[exp.length];
        long left = 0;
        for (int i = 0; i < exp.length; i++) { expected[i] = Long.parseLong(exp[i]); left += expected[i]; }
        Properties props = new Properties();
        props.put("bootstrap.servers", req(a, "bootstrap"));
        props.put("group.id", req(a, "group"));
        props.put("client.id", "bench-java-share");
        props.put("key.deserializer", ByteArrayDeserializer.class.getName());
        props.put("value.deserializer", ByteArrayDeserializer.class.getName());
        props.put("share.acknowledgement.mode", explicit ? "explicit" : "implicit");
        applySets(a, props);
        var os = (com.sun.management.OperatingSystemMXBean) ManagementFactory.getOperatingSystemMXBean();
        var runtime = ManagementFactory.getRuntimeMXBean();
        var jit = ManagementFactory.getCompilationMXBean();
        long constructStart = System.nanoTime(), cpuConstruct = os.getProcessCpuTime();
        long t0, cpu0, tFirst = 0, cpuFirst = 0, tLast, tCounted, cpuEnd, counted = 0, firstBatch = 0, kept = 0, check = 0;
        double jvmUptime, constructS, rssSetup, jit0;
        boolean capped = false;
        try (KafkaShareConsumer<byte[], byte[]> consumer = new KafkaShareConsumer<>(props)) {
            consumer.subscribe(List.of(req(a, "topic")));
            rssSetup = peakRssMb();
            jvmUptime = runtime.getUptime() / 1e3;
            jit0 = jit.getTotalCompilationTime() / 1e3;
            t0 = System.nanoTime();
            cpu0 = os.getProcessCpuTime();
            constructS = (t0 - constructStart) / 1e9;
            while (true) {
                ConsumerRecords<byte[], byte[]> recs = consumer.poll(Duration.ofMillis(1000));
                for (ConsumerRecord<byte[], byte[]> r : recs) {
                    if (raw) {
                        check += r.value().length;
                        kept++;
                    } else if (json) {
                        check += JSON.readTree(r.value()).get("id").asLong();
                        kept++;
                    } else {
                        Header h = r.headers().lastHeader(headerName);
                        if (h != null && Arrays.equals(h.value(), target)) {
                            check += JSON.readTree(r.value()).get("id").asLong();
                            kept++;
                        }
                    }
                    int i = r.partition();
                    if (++counts[i] > expected[i]) {
                        throw new IllegalStateException("partition " + i + ": " + counts[i] + " records counted, only "
                                                        + expected[i] + " were produced (delivered twice?)");
                    }
                    counted++;
                    left--;
                    if (explicit) consumer.acknowledge(r, AcknowledgeType.ACCEPT);
                }
                long now = System.nanoTime();
                if (tFirst == 0 && counted > 0) {
                    tFirst = now;
                    cpuFirst = os.getProcessCpuTime();
                    firstBatch = counted;
                }
                if (left == 0 || (now - t0) / 1e9 > maxSeconds) {
                    tCounted = now;
                    consumer.commitSync(Duration.ofSeconds(30));
                    tLast = System.nanoTime();
                    cpuEnd = os.getProcessCpuTime();
                    capped = left > 0;
                    break;
                }
            }
        }
        double seconds = (tLast - t0) / 1e9, steady = tFirst == 0 ? 0 : (tLast - tFirst) / 1e9;
        long gcCount = 0, gcMs = 0;
        for (var gc : ManagementFactory.getGarbageCollectorMXBeans()) {
            gcCount += Math.max(0, gc.getCollectionCount());
            gcMs += Math.max(0, gc.getCollectionTime());
        }
        ObjectNode out = JSON.createObjectNode();
        out.put("mode", mode);
        out.put("ack", explicit ? "explicit" : "implicit");
        out.put("records", counted);
        out.put("seconds", seconds);
        out.put("rate_incl_setup", seconds > 0 ? counted / seconds : 0.0);
        if (tFirst == 0) out.putNull("first_record_s"); else out.put("first_record_s", (tFirst - t0) / 1e9);
        out.put("first_batch", firstBatch);
        out.put("steady_seconds", steady);
        if (counted > firstBatch && steady > 0) out.put("records_per_s", (counted - firstBatch) / steady);
        else out.putNull("records_per_s");
        out.put("cpu_s", (cpuEnd - cpu0) / 1e9);
        if (tFirst == 0) out.putNull("steady_cpu_s"); else out.put("steady_cpu_s", (cpuEnd - cpuFirst) / 1e9);
        out.put("commit_s", (tLast - tCounted) / 1e9);
        out.put("check", check);
        out.put("kept", kept);
        out.put("capped", capped);
        ArrayNode cs = out.putArray("counts");
        for (long c : counts) cs.add(c);
        out.put("rss_setup_mb", rssSetup);
        out.put("rss_peak_mb", peakRssMb());
        out.put("jvm_uptime_at_first_poll_s", jvmUptime);
        out.put("construct_s", constructS);
        out.put("construct_cpu_s", (cpu0 - cpuConstruct) / 1e9);
        out.put("jit_compile_s", jit.getTotalCompilationTime() / 1e3 - jit0);
        out.put("gc_count", gcCount);
        out.put("gc_s", gcMs / 1e3);
        out.put("java", System.getProperty("java.vm.name") + " " + System.getProperty("java.version"));
        emit(out);
    }

    // One progress point: (seconds since the first poll call, records counted, CPU seconds, seconds
    // this process's threads spent runnable but waiting for a CPU), as bench/daemon's
    // SampledTally records after every poll of a Python peer.
    private static void sample(ArrayNode samples, double t, long counted, double cpu) {
        samples.addArray().add(t).add(counted).add(cpu).add(runDelaySeconds());
    }

    private static double runDelaySeconds() {
        long total = 0;
        try (var tasks = Files.list(Paths.get("/proc/self/task"))) {
            for (var task : (Iterable<java.nio.file.Path>) tasks::iterator) {
                try {
                    String[] f = Files.readString(task.resolve("schedstat")).trim().split(" ");
                    total += Long.parseLong(f[1]);
                } catch (Exception ignored) {
                    // a thread that ended between the listing and the read
                }
            }
        } catch (Exception ignored) {
            return 0.0;  // not Linux, or no schedstat: no wait figure
        }
        return total / 1e9;
    }

    private static double peakRssMb() {
        try {
            for (String line : Files.readAllLines(Paths.get("/proc/self/status"))) {
                if (line.startsWith("VmHWM:")) {
                    return Long.parseLong(line.replaceAll("[^0-9]", "")) / 1024.0;
                }
            }
        } catch (Exception ignored) {
            // not Linux: no peak RSS figure
        }
        return -1;
    }
}
