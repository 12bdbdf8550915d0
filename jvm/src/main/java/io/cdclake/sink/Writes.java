package io.cdclake.sink;

import org.apache.spark.sql.DataFrameWriter;
import org.apache.spark.sql.Row;

/**
 * A write's options in one call from Python (app/spark.py {@code with_options}): pyspark's {@code options(**kw)}
 * makes a call into the JVM per option, and another to release the writer each returns; a Silver upsert has some
 * forty.
 */
public final class Writes {
  private Writes() {
  }

  /** {@code writer} with the options of {@code pairs}: key, value, key, value..., each ended by a NUL character. */
  public static DataFrameWriter<Row> options(DataFrameWriter<Row> writer, String pairs) {
    String[] parts = pairs.split("\0", -1);
    // A trailing NUL ends the last value: parts holds one empty string more than the keys and values.
    if (parts.length % 2 != 1 || !parts[parts.length - 1].isEmpty()) {
      throw new IllegalArgumentException("options: keys and values must each end with a NUL character");
    }
    DataFrameWriter<Row> options = writer;
    for (int i = 0; i + 1 < parts.length; i += 2) {
      options = options.option(parts[i], parts[i + 1]);
    }
    return options;
  }
}
