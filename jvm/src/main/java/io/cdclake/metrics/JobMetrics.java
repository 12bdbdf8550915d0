package io.cdclake.metrics;

import com.codahale.metrics.Gauge;
import com.codahale.metrics.MetricRegistry;
import java.util.concurrent.ConcurrentHashMap;
import org.apache.spark.metrics.source.Source;

/**
 * The job's figures as a Dropwizard source of the driver's Spark metrics system ("cdc_lakehouse"), so every sink
 * Spark is configured with (the Prometheus servlet, JMX, CSV, a CloudWatch sink) exports them beside Spark's own.
 * The job (app/state/metrics.py) registers it (SparkEnv's metricsSystem().registerSource) and sets values by name; a gauge appears with its first value. An "age" gauge holds
 * a time and reads as the seconds since it, so it grows while nothing sets it again (freshness, a source gone quiet).
 */
public final class JobMetrics implements Source {
  public static final String SOURCE_NAME = "cdc_lakehouse";

  private final MetricRegistry registry = new MetricRegistry();
  private final ConcurrentHashMap<String, Double> values = new ConcurrentHashMap<>();
  private final ConcurrentHashMap<String, Long> times = new ConcurrentHashMap<>();

  @Override
  public String sourceName() {
    return SOURCE_NAME;
  }

  @Override
  public MetricRegistry metricRegistry() {
    return registry;
  }

  /** Set a gauge's value. */
  public void set(String name, double value) {
    if (values.put(name, value) == null) {
      registry.register(name, (Gauge<Double>) () -> values.get(name));
    }
  }

  /** Set an age gauge's time (milliseconds since the epoch); it reads as the seconds since. */
  public void setTime(String name, long epochMillis) {
    if (times.put(name, epochMillis) == null) {
      registry.register(name, (Gauge<Double>) () -> (System.currentTimeMillis() - times.get(name)) / 1000.0);
    }
  }

  /** A gauge's value, or an age gauge's seconds; NaN when there is none. */
  public double get(String name) {
    Double value = values.get(name);
    if (value != null) {
      return value;
    }
    Long time = times.get(name);
    return time == null ? Double.NaN : (System.currentTimeMillis() - time) / 1000.0;
  }
}
