package io.cdclake.sink;

import java.io.IOException;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.mapreduce.JobContext;
import org.apache.hadoop.mapreduce.JobStatus;
import org.apache.hadoop.mapreduce.TaskAttemptContext;
import org.apache.hadoop.mapreduce.lib.output.FileOutputCommitter;

/**
 * An output committer whose tasks write their files straight into the output folder: no task attempt folder, no
 * task or job commit moving files, no {@code _SUCCESS}. For the job's own Parquet writes whose folders it marks
 * complete itself, once every file is in place (app/sink/bronze.py's range folders, app/sink/ledger.py's fact
 * folders): a folder without its marker is a write cut short, which the job removes or ignores. Hadoop's committer
 * renames each file twice on its way to the folder, and a rename on S3 is a copy.
 *
 * <p>Chosen per write, through the write's option {@code spark.sql.parquet.output.committer.class} (Spark's Parquet
 * writer reads it from the write's Hadoop configuration); not with {@code spark.speculation} on (app/sink/lakefs.py).
 * Spark's file names hold the write's job id and the task's partition, not the attempt, and Parquet creates a file
 * only where none is: an attempt run again after an earlier one finished a file fails on it, and so does the write.
 * A failed write leaves its caller's folder without its marker: the batch fails, and its replay writes it again.
 * On S3 a file appears whole at its close or not at all.
 */
public final class DirectOutputCommitter extends FileOutputCommitter {
  private final Path output;

  public DirectOutputCommitter(Path outputPath, TaskAttemptContext context) throws IOException {
    super(outputPath, context);
    this.output = outputPath;
  }

  /** Where Spark's tasks put their files: the output folder itself. */
  @Override
  public Path getWorkPath() {
    return output;
  }

  @Override
  public void setupJob(JobContext context) {
  }

  @Override
  public void setupTask(TaskAttemptContext context) {
  }

  @Override
  public boolean needsTaskCommit(TaskAttemptContext context) {
    return false;
  }

  @Override
  public void commitTask(TaskAttemptContext context) {
  }

  @Override
  public void abortTask(TaskAttemptContext context) {
  }

  @Override
  public void commitJob(JobContext context) {
  }

  @Override
  public void cleanupJob(JobContext context) {
  }

  @Override
  public void abortJob(JobContext context, JobStatus.State state) {
  }

  @Override
  public boolean isRecoverySupported() {
    return false;
  }
}
