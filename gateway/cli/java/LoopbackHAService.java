// The HA service of the test broker that gateway/cli/rocketmq_dist.py starts (compiled there,
// at resolve time, against the RocketMQ 5.5.0 jars).
//
// DefaultHAService.start() opens its replication listener on new InetSocketAddress(haListenPort),
// every interface, and no setting changes that. A single master has no slave to accept, so this
// one starts what a master needs (group transfer, connection-state notification; the HA client
// only for a slave) and never the accept socket. shutdown() is inherited: it null-checks, and
// ServiceThread.shutdown returns at once for a thread that never started (checked on 5.5.0).
// The message store loads it through the class-path resource
// META-INF/service/org.apache.rocketmq.store.ha.HAService ("service", singular: ServiceProvider).
// Bump DIST_REVISION in rocketmq_dist.py when this file changes: the compiled class is cached.
package mqgw;

import org.apache.rocketmq.store.ha.DefaultHAService;

public class LoopbackHAService extends DefaultHAService {
    @Override
    public void start() throws Exception {
        groupTransferService.start();
        haConnectionStateNotificationService.start();
        if (haClient != null) {
            haClient.start();
        }
    }
}
