package io.cdclake.testing;

import java.util.Arrays;
import java.util.Set;

import org.apache.hudi.client.WriteStatus;
import org.apache.hudi.client.validator.SparkPreCommitValidator;
import org.apache.hudi.common.data.HoodieData;
import org.apache.hudi.common.engine.HoodieEngineContext;
import org.apache.hudi.config.HoodieWriteConfig;
import org.apache.hudi.table.HoodieSparkTable;
import org.apache.hudi.table.action.HoodieWriteMetadata;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Row;

/**
 * Test only: the crash test's "inside a Hudi commit" kill point. Hudi runs pre-commit validators after the
 * commit's data files and markers are written and before the instant completes. When the environment arms the
 * point (CDC_PAUSE_AT lists {@code hudi_commit}), the first commit of a table whose base path contains
 * CDC_PAUSE_TABLE (any table when unset) writes {@code <CDC_PAUSE_DIR>/hudi_commit.json} and sleeps until the
 * process is killed. Unarmed, it returns at once. The job adds it to {@code hoodie.precommit.validators} only
 * when the point is armed (devkit/pauses.py).
 */
public class PausingPreCommitValidator<T, I, K, O extends HoodieData<WriteStatus>>
    extends SparkPreCommitValidator<T, I, K, O> {

  public static final String POINT = "hudi_commit";

  public PausingPreCommitValidator(
      HoodieSparkTable<T> table, HoodieEngineContext context, HoodieWriteConfig config) {
    super(table, context, config);
  }

  @Override
  public void validate(
      String instantTime, HoodieWriteMetadata<O> metadata, Dataset<Row> before, Dataset<Row> after) {
    String armed = System.getenv().getOrDefault("CDC_PAUSE_AT", "");
    String dir = System.getenv("CDC_PAUSE_DIR");
    String table = System.getenv().getOrDefault("CDC_PAUSE_TABLE", "");
    String basePath = getWriteConfig().getBasePath();
    if (dir == null || !Arrays.asList(armed.split(",")).contains(POINT) || !basePath.contains(table)) {
      return;
    }
    CreationPauses.pause(dir, POINT, "{\"point\": \"" + POINT + "\", \"instant\": \"" + instantTime
        + "\", \"table\": \"" + basePath + "\"}");
  }

  @Override
  protected void validateRecordsBeforeAndAfter(
      Dataset<Row> before, Dataset<Row> after, Set<String> partitionsAffected) {
    // validate() above decides; the record sets are never read.
  }
}
