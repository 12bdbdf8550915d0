package io.cdclake.testing;

import java.io.IOException;

import org.apache.hadoop.fs.FSDataOutputStream;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.permission.FsPermission;
import org.apache.hadoop.fs.s3a.S3AFileSystem;
import org.apache.hadoop.util.Progressable;

/** Test only: s3a with the creation pause points of {@link CreationPauses} ({@code fs.s3a.impl}). */
public class PausingS3AFileSystem extends S3AFileSystem {

  @Override
  public FSDataOutputStream create(Path f, FsPermission permission, boolean overwrite, int bufferSize,
      short replication, long blockSize, Progressable progress) throws IOException {
    CreationPauses.before("create", f.toString());
    return super.create(f, permission, overwrite, bufferSize, replication, blockSize, progress);
  }

  @Override
  public boolean mkdirs(Path path, FsPermission permission) throws IOException {
    CreationPauses.before("mkdirs", path.toString());
    return super.mkdirs(path, permission);
  }

  @Override
  public boolean rename(Path src, Path dst) throws IOException {
    CreationPauses.before("rename", src + " -> " + dst);
    return super.rename(src, dst);
  }

  @Override
  public boolean delete(Path f, boolean recursive) throws IOException {
    CreationPauses.before("delete", f.toString());
    return super.delete(f, recursive);
  }
}
