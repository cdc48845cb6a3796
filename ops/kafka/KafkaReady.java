import java.time.Duration;
import java.util.Collection;
import java.util.Properties;
import java.util.Set;
import java.util.concurrent.TimeUnit;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.DescribeClusterResult;
import org.apache.kafka.common.Node;

/**
 * Readiness probe used by dev-kafka.sh.
 *
 * <p>Usage: {@code KafkaReady <bootstrap host:port> <timeout ms>}
 *
 * <p>Sends real Kafka requests (DescribeCluster / Metadata, ListTopics) to the
 * broker and exits 0 only when it answers with at least one registered broker.
 * A listening socket alone is not enough: the broker may accept TCP
 * connections before it has joined the KRaft quorum and been unfenced.
 * Exits 1 when the broker is not ready yet, 2 on bad usage.
 */
public final class KafkaReady {

    private KafkaReady() {
    }

    public static void main(String[] args) {
        if (args.length != 2) {
            System.err.println("usage: KafkaReady <bootstrap host:port> <timeout ms>");
            System.exit(2);
        }
        String bootstrap = args[0];
        int timeoutMs = Integer.parseInt(args[1]);

        Properties props = new Properties();
        props.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        props.put(AdminClientConfig.CLIENT_ID_CONFIG, "dev-kafka-ready-check");
        props.put(AdminClientConfig.REQUEST_TIMEOUT_MS_CONFIG, timeoutMs);
        props.put(AdminClientConfig.DEFAULT_API_TIMEOUT_MS_CONFIG, timeoutMs);
        props.put(AdminClientConfig.RETRY_BACKOFF_MS_CONFIG, 100);
        props.put(AdminClientConfig.RECONNECT_BACKOFF_MS_CONFIG, 100);

        int status = 1;
        Admin admin = Admin.create(props);
        try {
            DescribeClusterResult cluster = admin.describeCluster();
            String clusterId = cluster.clusterId().get(timeoutMs, TimeUnit.MILLISECONDS);
            Collection<Node> nodes = cluster.nodes().get(timeoutMs, TimeUnit.MILLISECONDS);
            if (nodes.isEmpty()) {
                System.err.println("not ready: no broker registered yet");
            } else {
                Set<String> topics = admin.listTopics().names().get(timeoutMs, TimeUnit.MILLISECONDS);
                System.out.println("ready: cluster " + clusterId + ", brokers " + nodes
                        + ", " + topics.size() + " topic(s)");
                status = 0;
            }
        } catch (Exception e) {
            Throwable cause = e.getCause() != null ? e.getCause() : e;
            System.err.println("not ready: " + cause);
        } finally {
            admin.close(Duration.ofSeconds(2));
        }
        System.exit(status);
    }
}
